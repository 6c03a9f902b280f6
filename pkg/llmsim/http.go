package llmsim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/openai"
)

// maxBodyBytes bounds a request body; the largest useful prompt is one
// replica's whole KV cache, far below this.
const maxBodyBytes = 8 << 20

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("GET /admin/config", s.handleGetConfig)
	mux.HandleFunc("POST /admin/config", s.handleSetConfig)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, typ, format string, args ...any) {
	writeJSON(w, status, openai.ErrorResponse{Error: openai.Error{Message: fmt.Sprintf(format, args...), Type: typ}})
}

// badRequest answers 400 with OpenAI's error shape, naming the field at
// fault when err is a *requestError that does.
func badRequest(w http.ResponseWriter, err error) {
	param := openai.Null[string]()
	var code openai.Code
	var re *requestError
	if errors.As(err, &re) && re.param != "" {
		param = openai.Of(re.param)
		code = openai.Code(re.code)
	}
	writeJSON(w, http.StatusBadRequest, openai.ErrorResponse{Error: openai.Error{
		Message: err.Error(), Type: "invalid_request_error", Param: param, Code: code,
	}})
}

func newCompletionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "chatcmpl-" + hex.EncodeToString(b[:])
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	p, err := s.parseChat(r)
	if err != nil {
		badRequest(w, err)
		return
	}
	id := newCompletionID()
	log := s.log.With("completion_id", id)
	if rid := r.Header.Get("X-Request-Id"); rid != "" {
		log = log.With("request_id", rid)
	}

	// The output budget is also capped by the context left after the prompt,
	// which is what a full KV cache for one sequence can hold.
	budget := min(p.maxTokens, s.cfg.contextTokens()-p.promptTokens)
	scripts, start := s.planReply(p, budget)
	seqs, events := s.sequences(r.Context(), p.promptTokens, scripts, start, p.priority)
	if err := s.submit(seqs); err != nil {
		status := http.StatusServiceUnavailable
		var fault *faultStatus
		if errors.As(err, &fault) {
			status = fault.status
		}
		log.Warn("refused chat completion", "err", err)
		writeError(w, status, "server_error", "%s", err.Error())
		return
	}
	target := 0
	for _, sc := range scripts {
		target += sc.target
	}
	log.Debug("chat completion queued", "prompt_tokens", p.promptTokens, "choices", p.n,
		"target_tokens", target, "stream", p.stream, "tool_call", scripts[0].call != nil)

	a := reply{choices: scripts, events: events, log: log, usage: openai.Usage{PromptTokens: p.promptTokens},
		header: openai.Header{ID: id, Created: time.Now().Unix(), Model: p.model}}
	if p.stream {
		s.stream(r.Context(), w, a, p.includeUsage)
		return
	}
	s.complete(r.Context(), w, a)
}

// sequences makes a request's sequences, one per choice, sharing its
// prompt and one events channel with room for all they report.
func (s *Server) sequences(ctx context.Context, promptTokens int, scripts []script, start, priority int) ([]*sequence, <-chan event) {
	room := 0
	for _, sc := range scripts {
		room += sc.target + 1
	}
	events := make(chan event, room)
	pr := newPrompt(promptTokens, s.cfg.BlockSize)
	arrival := s.clock.Now()
	seqs := make([]*sequence, len(scripts))
	for i, sc := range scripts {
		seqs[i] = &sequence{
			ctx:     ctx,
			prompt:  pr,
			choice:  i,
			target:  sc.target,
			reason:  sc.reason,
			out:     sc.out,
			start:   start,
			arrival: arrival,
			events:  events,

			priority: priority,
		}
	}
	return seqs, events
}

// reply is what the handler needs to write one completion.
type reply struct {
	// choices are the scripts of the answers, by choice index.
	choices []script
	events  <-chan event
	log     *slog.Logger
	header  openai.Header
	usage   openai.Usage
}

// complete waits for every choice's whole answer and writes them as one
// completion.
func (s *Server) complete(ctx context.Context, w http.ResponseWriter, a reply) {
	texts := make([]strings.Builder, len(a.choices))
	choices := make([]openai.Choice, len(a.choices))
	left := len(a.choices)
	u := a.usage
	for left > 0 {
		select {
		case <-ctx.Done():
			a.log.Debug("client went away", "completion_tokens", u.CompletionTokens)
			return
		case ev := <-a.events:
			switch {
			case errors.Is(ev.err, errDied):
				dropConnection(a.log, u.CompletionTokens)
			case ev.err != nil:
				writeError(w, http.StatusServiceUnavailable, "server_error", "%s", ev.err.Error())
				return
			case ev.done:
				sc := a.choices[ev.choice]
				choices[ev.choice] = openai.Choice{Index: ev.choice, Message: sc.message(texts[ev.choice].String()),
					FinishReason: sc.finishReason(ev.reason)}
				left--
			default:
				texts[ev.choice].WriteString(ev.text)
				u.CompletionTokens++
			}
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	header := a.header
	header.Object = openai.ObjectChatCompletion
	writeJSON(w, http.StatusOK, openai.Completion{Header: header, Choices: choices, Usage: u})
	reasons := make([]string, len(choices))
	for i, c := range choices {
		reasons[i] = c.FinishReason
	}
	a.log.Debug("chat completion finished", "finish_reasons", reasons, "completion_tokens", u.CompletionTokens)
}

// stream writes the OpenAI SSE stream. Every choice has an opening chunk
// with its first token, one chunk per token that adds text and a finish
// chunk, one choice a chunk, interleaved as the engine produces them; the
// usage chunk if asked and [DONE] follow the last choice's finish.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, a reply, includeUsage bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// Headers go out at once, as vLLM's streaming response does; the first
	// chunk waits for the first token.
	_ = rc.Flush()

	header := a.header
	header.Object = openai.ObjectChatCompletionChunk
	out := &chunkWriter{w: w, rc: rc, base: openai.Chunk{Header: header}}
	if includeUsage {
		// OpenAI sends "usage": null on every chunk but the last.
		out.base.Usage = openai.Null[openai.Usage]()
	}
	opened := make([]bool, len(a.choices))
	reasons := make([]string, len(a.choices))
	left := len(a.choices)
	u := a.usage
	for {
		var ev event
		select {
		case <-ctx.Done():
			a.log.Debug("client went away", "completion_tokens", u.CompletionTokens)
			return
		case ev = <-a.events:
		}
		sc := a.choices[ev.choice]
		var err error
		switch {
		case errors.Is(ev.err, errDied):
			dropConnection(a.log, u.CompletionTokens)
		case ev.err != nil:
			b, _ := json.Marshal(openai.ErrorResponse{Error: openai.Error{Message: ev.err.Error(), Type: "server_error"}})
			_ = writeEvent(w, rc, b)
			return
		case ev.done:
			reasons[ev.choice] = sc.finishReason(ev.reason)
			err = out.step(ev.choice, openai.Delta{}, &reasons[ev.choice])
			left--
		default:
			err = sc.sendToken(out, ev.choice, ev.text, !opened[ev.choice])
			opened[ev.choice] = true
			u.CompletionTokens++
		}
		if err != nil {
			// The client is gone; returning cancels the request context,
			// which makes the engine abort the sequences.
			a.log.Debug("write chunk", "err", err)
			return
		}
		if left == 0 {
			if err := out.end(u); err != nil {
				a.log.Debug("write final chunks", "err", err)
				return
			}
			a.log.Debug("chat completion finished", "finish_reasons", reasons, "completion_tokens", u.CompletionTokens)
			return
		}
	}
}

// dropConnection ends the handler by closing its connection with no
// more bytes: net/http's own way to abort a response, which a client sees
// as a stream broken mid-answer.
func dropConnection(log *slog.Logger, sent int) {
	log.Debug("dropping the connection (die_after_tokens fault)", "completion_tokens", sent)
	panic(http.ErrAbortHandler)
}

// sendToken streams a token of choice i: after the choice's opening chunk
// if it is the first, and not at all if it adds no text (the tokens of a
// stop sequence).
func (sc script) sendToken(out *chunkWriter, i int, text string, first bool) error {
	if first {
		if err := out.step(i, sc.opening(), nil); err != nil {
			return err
		}
	}
	if text == "" {
		return nil
	}
	return out.step(i, sc.piece(text), nil)
}

// chunkWriter writes one completion's chunks as server-sent events.
type chunkWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// base is what every chunk repeats.
	base openai.Chunk
}

// step sends a chunk with choice i's next step.
func (cw *chunkWriter) step(i int, d openai.Delta, finish *string) error {
	c := cw.base
	c.Choices = []openai.ChunkChoice{{Index: i, Delta: d, FinishReason: finish}}
	return cw.send(c)
}

// end ends the stream once every choice has finished: the usage chunk if
// the client asked for it, and [DONE].
func (cw *chunkWriter) end(u openai.Usage) error {
	if cw.base.Usage.Present {
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
		last := cw.base
		last.Choices = []openai.ChunkChoice{}
		last.Usage = openai.Of(u)
		if err := cw.send(last); err != nil {
			return err
		}
	}
	return writeEvent(cw.w, cw.rc, []byte("[DONE]"))
}

func (cw *chunkWriter) send(c openai.Chunk) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode chunk: %w", err)
	}
	return writeEvent(cw.w, cw.rc, b)
}

func writeEvent(w http.ResponseWriter, rc *http.ResponseController, data []byte) error {
	if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
		return fmt.Errorf("write event: %w", err)
	}
	if err := rc.Flush(); err != nil {
		return fmt.Errorf("flush event: %w", err)
	}
	return nil
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, openai.ModelList{Object: openai.ObjectList, Data: []openai.Model{{
		ID: s.cfg.Model, Object: openai.ObjectModel, Created: time.Now().Unix(), OwnedBy: "sluice-llmsim",
		MaxModelLen: s.cfg.contextTokens(),
	}}})
}

func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	if err := s.metrics.write(w, s.Stats()); err != nil {
		s.log.Debug("serve metrics", "err", err)
	}
}

func (s *Server) handleGetConfig(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.RuntimeConfig())
}

func (s *Server) handleSetConfig(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	dec := json.NewDecoder(r.Body)
	// A misspelt field would otherwise be a silent no-op.
	dec.DisallowUnknownFields()
	var u ConfigUpdate
	if err := dec.Decode(&u); err != nil {
		badRequest(w, fmt.Errorf("invalid config update JSON: %w", err))
		return
	}
	rc, err := s.Reconfigure(u)
	switch {
	case errors.Is(err, ErrInvalidUpdate):
		badRequest(w, err)
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, "server_error", "%s", err.Error())
	default:
		writeJSON(w, http.StatusOK, rc)
	}
}
