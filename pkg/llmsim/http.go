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
	"github.com/sluice-dev/sluice/pkg/tokens"
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

// messageText flattens a message's content to its text parts, in order;
// the simulator skips parts it cannot read rather than refuse them.
func messageText(m openai.Message) (string, error) {
	parts, err := m.Parts()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == openai.ContentPartText && p.Text != nil {
			b.WriteString(*p.Text)
		}
	}
	return b.String(), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, typ, format string, args ...any) {
	writeJSON(w, status, openai.ErrorResponse{Error: openai.Error{Message: fmt.Sprintf(format, args...), Type: typ}})
}

func badRequest(w http.ResponseWriter, format string, args ...any) {
	writeError(w, http.StatusBadRequest, "invalid_request_error", format, args...)
}

func newCompletionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "chatcmpl-" + hex.EncodeToString(b[:])
}

// parsedChat is a validated request ready for the engine.
type parsedChat struct {
	msgs         []tokens.Message
	promptTokens int
	maxTokens    int
	stream       bool
	includeUsage bool
}

// parseChat decodes and validates a request; the error text is meant for
// the client. The model is not checked: the gateway may name its pools'
// models freely.
func (s *Server) parseChat(r *http.Request) (parsedChat, error) {
	var req openai.ChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return parsedChat{}, fmt.Errorf("invalid JSON body: %v", err)
	}
	if len(req.Messages) == 0 {
		return parsedChat{}, errors.New("messages must be a non-empty array")
	}
	if req.N != nil && *req.N != 1 {
		return parsedChat{}, errors.New("the simulator only supports n=1")
	}
	p := parsedChat{stream: req.Stream, maxTokens: s.cfg.DefaultMaxTokens}
	p.includeUsage = req.Stream && req.IncludeUsage()
	if limit := req.MaxOutputTokens(); limit != nil {
		p.maxTokens = *limit
	}
	if p.maxTokens < 1 {
		return parsedChat{}, fmt.Errorf("max_tokens must be at least 1, got %d", p.maxTokens)
	}
	for i, m := range req.Messages {
		if m.Role == "" {
			return parsedChat{}, fmt.Errorf("messages[%d].role is required", i)
		}
		text, err := messageText(m)
		if err != nil {
			return parsedChat{}, fmt.Errorf("messages[%d].content: %v", i, err)
		}
		p.msgs = append(p.msgs, tokens.Message{Role: m.Role, Content: text})
	}
	p.promptTokens = s.counter.CountChat(p.msgs)
	// A prompt that cannot fit one replica's whole KV cache (with room for
	// one output token) could never be scheduled; vLLM refuses it likewise.
	if limit := s.cfg.contextTokens(); p.promptTokens+1 > limit {
		//lint:ignore ST1005 the message mirrors vLLM's, which clients may match on
		return parsedChat{}, fmt.Errorf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens.", limit, p.promptTokens)
	}
	return p, nil
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	p, err := s.parseChat(r)
	if err != nil {
		badRequest(w, "%s", err.Error())
		return
	}
	id := newCompletionID()
	log := s.log.With("completion_id", id)
	if rid := r.Header.Get("X-Request-Id"); rid != "" {
		log = log.With("request_id", rid)
	}

	ans := newAnswer(s.cfg.Seed, p.msgs)
	target, reason := ans.naturalLength(s.cfg.AnswerMinTokens, s.cfg.AnswerMaxTokens), finishStop
	// The output budget is also capped by the context left after the prompt,
	// which is what a full KV cache for one sequence can hold.
	budget := min(p.maxTokens, s.cfg.contextTokens()-p.promptTokens)
	if budget <= target {
		target, reason = budget, finishLength
	}
	seq := &sequence{
		ctx:     r.Context(),
		prompt:  p.promptTokens,
		target:  target,
		reason:  reason,
		ans:     ans,
		arrival: s.clock.Now(),
		events:  make(chan event, target+1),
	}
	if err := s.submit(seq); err != nil {
		status := http.StatusServiceUnavailable
		var fault *faultStatus
		if errors.As(err, &fault) {
			status = fault.status
		}
		log.Warn("refused chat completion", "err", err)
		writeError(w, status, "server_error", "%s", err.Error())
		return
	}
	log.Debug("chat completion queued", "prompt_tokens", p.promptTokens, "target_tokens", target, "stream", p.stream)

	u := openai.Usage{PromptTokens: p.promptTokens}
	header := openai.Header{ID: id, Created: time.Now().Unix(), Model: s.cfg.Model}
	if p.stream {
		s.stream(r.Context(), w, log, seq, p.includeUsage, header, u)
		return
	}
	s.complete(r.Context(), w, log, seq, header, u)
}

// complete waits for the whole answer and writes it as one completion.
func (s *Server) complete(ctx context.Context, w http.ResponseWriter, log *slog.Logger, seq *sequence, header openai.Header, u openai.Usage) {
	var text strings.Builder
	for {
		select {
		case <-ctx.Done():
			log.Debug("client went away", "completion_tokens", u.CompletionTokens)
			return
		case ev := <-seq.events:
			switch {
			case ev.err != nil:
				writeError(w, http.StatusServiceUnavailable, "server_error", "%s", ev.err.Error())
				return
			case ev.done:
				u.TotalTokens = u.PromptTokens + u.CompletionTokens
				header.Object = openai.ObjectChatCompletion
				writeJSON(w, http.StatusOK, openai.Completion{
					Header: header,
					Choices: []openai.Choice{{
						Message:      openai.AssistantMessage{Role: "assistant", Content: text.String()},
						FinishReason: ev.reason,
					}},
					Usage: u,
				})
				log.Debug("chat completion finished", "finish_reason", ev.reason, "completion_tokens", u.CompletionTokens)
				return
			default:
				text.WriteString(ev.text)
				u.CompletionTokens++
			}
		}
	}
}

// stream writes the OpenAI SSE stream: a role chunk with the first token,
// one chunk per token, a finish chunk, the usage chunk if asked, [DONE].
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, log *slog.Logger, seq *sequence, includeUsage bool, header openai.Header, u openai.Usage) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// Headers go out at once, as vLLM's streaming response does; the first
	// chunk waits for the first token.
	_ = rc.Flush()

	header.Object = openai.ObjectChatCompletionChunk
	out := &chunkWriter{w: w, rc: rc, base: openai.Chunk{Header: header}}
	if includeUsage {
		// OpenAI sends "usage": null on every chunk but the last.
		out.base.Usage = openai.Null[openai.Usage]()
	}
	first := true
	for {
		var ev event
		select {
		case <-ctx.Done():
			log.Debug("client went away", "completion_tokens", u.CompletionTokens)
			return
		case ev = <-seq.events:
		}
		var err error
		switch {
		case ev.err != nil:
			b, _ := json.Marshal(openai.ErrorResponse{Error: openai.Error{Message: ev.err.Error(), Type: "server_error"}})
			_ = writeEvent(w, rc, b)
			return
		case ev.done:
			if err := out.finish(ev.reason, u); err != nil {
				log.Debug("write final chunks", "err", err)
				return
			}
			log.Debug("chat completion finished", "finish_reason", ev.reason, "completion_tokens", u.CompletionTokens)
			return
		default:
			if first {
				first = false
				empty := ""
				err = out.step(openai.Delta{Role: "assistant", Content: &empty}, nil)
			}
			if err == nil {
				text := ev.text
				err = out.step(openai.Delta{Content: &text}, nil)
			}
			u.CompletionTokens++
		}
		if err != nil {
			// The client is gone; returning cancels the request context,
			// which makes the engine abort the sequence.
			log.Debug("write chunk", "err", err)
			return
		}
	}
}

// chunkWriter writes one answer's chunks as server-sent events.
type chunkWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// base is what every chunk repeats.
	base openai.Chunk
}

// step sends a chunk with the one choice's next step.
func (cw *chunkWriter) step(d openai.Delta, finish *string) error {
	c := cw.base
	c.Choices = []openai.ChunkChoice{{Delta: d, FinishReason: finish}}
	return cw.send(c)
}

// finish ends the stream: the finish chunk, the usage chunk if the client
// asked for it, and [DONE].
func (cw *chunkWriter) finish(reason string, u openai.Usage) error {
	if err := cw.step(openai.Delta{}, &reason); err != nil {
		return err
	}
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
		badRequest(w, "invalid config update JSON: %v", err)
		return
	}
	rc, err := s.Reconfigure(u)
	switch {
	case errors.Is(err, ErrInvalidUpdate):
		badRequest(w, "%s", err.Error())
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, "server_error", "%s", err.Error())
	default:
		writeJSON(w, http.StatusOK, rc)
	}
}
