package llmsim

import (
	"bytes"
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

// chatRequest is the subset of OpenAI's chat completion request the
// simulator reads. Model is not checked: the gateway may name its pools'
// models freely. Other fields (temperature, top_p, ...) are ignored.
type chatRequest struct {
	Model               string        `json:"model"`
	Messages            []wireMessage `json:"messages"`
	MaxTokens           *int          `json:"max_tokens"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	N                   *int          `json:"n"`
	Stream              bool          `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// chatMessage is a message with its content flattened to text.
type chatMessage struct {
	Role    string
	Content string
}

// text flattens OpenAI message content: a string, null, or an array of
// parts of which the text parts count.
func (m wireMessage) text() (string, error) {
	raw := bytes.TrimSpace(m.Content)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        delta   `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

// chunk is one chat.completion.chunk. Usage is present (null until the last
// chunk, then a usage) only when the client asked for include_usage, as
// OpenAI does.
type chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   any           `json:"usage,omitempty"`
}

type completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   usage              `json:"usage"`
}

type completionChoice struct {
	Index        int            `json:"index"`
	Message      messageContent `json:"message"`
	FinishReason string         `json:"finish_reason"`
}

type messageContent struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, typ, format string, args ...any) {
	writeJSON(w, status, apiError{Error: apiErrorBody{Message: fmt.Sprintf(format, args...), Type: typ}})
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
	msgs         []chatMessage
	promptTokens int
	maxTokens    int
	stream       bool
	includeUsage bool
}

// parseChat decodes and validates a request; the error text is meant for
// the client.
func (s *Server) parseChat(r *http.Request) (parsedChat, error) {
	var req chatRequest
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
	p.includeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	switch {
	case req.MaxCompletionTokens != nil:
		p.maxTokens = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		p.maxTokens = *req.MaxTokens
	}
	if p.maxTokens < 1 {
		return parsedChat{}, fmt.Errorf("max_tokens must be at least 1, got %d", p.maxTokens)
	}
	counted := make([]tokens.Message, 0, len(req.Messages))
	for i, m := range req.Messages {
		if m.Role == "" {
			return parsedChat{}, fmt.Errorf("messages[%d].role is required", i)
		}
		text, err := m.text()
		if err != nil {
			return parsedChat{}, fmt.Errorf("messages[%d].content: %v", i, err)
		}
		p.msgs = append(p.msgs, chatMessage{Role: m.Role, Content: text})
		counted = append(counted, tokens.Message{Role: m.Role, Content: text})
	}
	p.promptTokens = s.counter.CountChat(counted)
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
		log.Warn("refused chat completion", "err", err)
		writeError(w, http.StatusServiceUnavailable, "server_error", "%s", err.Error())
		return
	}
	log.Debug("chat completion queued", "prompt_tokens", p.promptTokens, "target_tokens", target, "stream", p.stream)

	u := usage{PromptTokens: p.promptTokens}
	created := time.Now().Unix()
	if p.stream {
		s.stream(r.Context(), w, log, seq, p, id, created, u)
		return
	}
	var text strings.Builder
	for {
		select {
		case <-r.Context().Done():
			log.Debug("client went away", "completion_tokens", u.CompletionTokens)
			return
		case ev := <-seq.events:
			switch {
			case ev.err != nil:
				writeError(w, http.StatusServiceUnavailable, "server_error", "%s", ev.err.Error())
				return
			case ev.done:
				u.TotalTokens = u.PromptTokens + u.CompletionTokens
				writeJSON(w, http.StatusOK, completion{
					ID: id, Object: "chat.completion", Created: created, Model: s.cfg.Model,
					Choices: []completionChoice{{
						Message:      messageContent{Role: "assistant", Content: text.String()},
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
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, log *slog.Logger, seq *sequence, p parsedChat, id string, created int64, u usage) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// Headers go out at once, as vLLM's streaming response does; the first
	// chunk waits for the first token.
	_ = rc.Flush()

	base := chunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model}
	if p.includeUsage {
		// OpenAI sends "usage": null on every chunk but the last.
		base.Usage = json.RawMessage("null")
	}
	send := func(c chunk) error {
		b, err := json.Marshal(c)
		if err != nil {
			return fmt.Errorf("encode chunk: %w", err)
		}
		return writeEvent(w, rc, b)
	}
	withChoice := func(d delta, finish *string) chunk {
		c := base
		c.Choices = []chunkChoice{{Delta: d, FinishReason: finish}}
		return c
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
			b, _ := json.Marshal(apiError{Error: apiErrorBody{Message: ev.err.Error(), Type: "server_error"}})
			_ = writeEvent(w, rc, b)
			return
		case ev.done:
			reason := ev.reason
			err = send(withChoice(delta{}, &reason))
			if err == nil && p.includeUsage {
				u.TotalTokens = u.PromptTokens + u.CompletionTokens
				last := base
				last.Choices = []chunkChoice{}
				last.Usage = u
				err = send(last)
			}
			if err == nil {
				err = writeEvent(w, rc, []byte("[DONE]"))
			}
			if err != nil {
				log.Debug("write final chunks", "err", err)
				return
			}
			log.Debug("chat completion finished", "finish_reason", reason, "completion_tokens", u.CompletionTokens)
			return
		default:
			if first {
				first = false
				empty := ""
				err = send(withChoice(delta{Role: "assistant", Content: &empty}, nil))
			}
			if err == nil {
				text := ev.text
				err = send(withChoice(delta{Content: &text}, nil))
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

func writeEvent(w http.ResponseWriter, rc *http.ResponseController, data []byte) error {
	if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
		return fmt.Errorf("write event: %w", err)
	}
	if err := rc.Flush(); err != nil {
		return fmt.Errorf("flush event: %w", err)
	}
	return nil
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen is vLLM's extension to the model card.
	MaxModelLen int `json:"max_model_len"`
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{{
		ID: s.cfg.Model, Object: "model", Created: time.Now().Unix(), OwnedBy: "sluice-llmsim",
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
