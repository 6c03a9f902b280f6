// Package llm talks to LLM backends through the OpenAI-compatible chat
// completions API (vLLM, TGI, Ollama, llama.cpp and OpenAI all serve it),
// streaming the answer as it is generated.
package llm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/openai"
)

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request is one chat completion.
type Request struct {
	Model     string
	Messages  []Message
	MaxTokens int
}

// Usage is what the backend reports it used.
type Usage = openai.Usage

// Result summarises a finished stream.
type Result struct {
	// Usage as reported by the backend, if UsageReported.
	Usage         Usage
	UsageReported bool
	// Chunks is the number of non-empty content deltas streamed.
	Chunks       int
	FinishReason string
	Endpoint     string
}

// Streamer streams one chat completion, calling onDelta for every piece
// of content in order. If onDelta returns an error the stream stops and
// Stream returns that error.
type Streamer interface {
	Stream(ctx context.Context, req Request, onDelta func(text string) error) (Result, error)
}

// Error is a backend failure with the HTTP status, if any.
type Error struct {
	Endpoint string
	Status   int
	Message  string
	// Retryable is true for failures a later attempt may not see:
	// connection errors, 408, 429 and 5xx.
	Retryable bool
}

func (e *Error) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("llm %s: %s", e.Endpoint, e.Message)
	}
	return fmt.Sprintf("llm %s: HTTP %d: %s", e.Endpoint, e.Status, e.Message)
}

// IsRetryable reports whether err is worth another attempt.
func IsRetryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable
	}
	return false
}

// OpenAI is a client for one pool's OpenAI-compatible endpoints, spread
// round-robin.
type OpenAI struct {
	endpoints []string
	apiKey    string
	http      *http.Client
	next      atomic.Uint64
}

// OpenAIOptions configures an OpenAI client.
type OpenAIOptions struct {
	// Endpoints are base URLs; "/v1" is appended when they lack it.
	Endpoints []string
	APIKey    string
	// HTTPClient defaults to one with no overall timeout (streams are
	// bounded by the caller's context) and a 10 s connect/header timeout.
	HTTPClient *http.Client
}

// NewOpenAI returns a client.
func NewOpenAI(opts OpenAIOptions) (*OpenAI, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("llm: no endpoints")
	}
	c := &OpenAI{apiKey: opts.APIKey, http: opts.HTTPClient}
	for _, e := range opts.Endpoints {
		e = strings.TrimRight(e, "/")
		if !strings.HasSuffix(e, "/v1") {
			e += "/v1"
		}
		c.endpoints = append(c.endpoints, e)
	}
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{
			Proxy:                 nil,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 60 * time.Second,
			DisableCompression:    true,
		}}
	}
	return c, nil
}

// streamEvent is one data line of a stream as the client reads it: a
// chunk, or an error from a server that failed mid-answer. Only what is
// read is decoded, so that a server's quirks in the rest of a chunk do
// not break its streams.
type streamEvent struct {
	Choices []openai.ChunkChoice   `json:"choices"`
	Usage   openai.Optional[Usage] `json:"usage"`
	Error   *openai.Error          `json:"error"`
}

// chatRequest is the body of a streamed completion of req, with usage
// asked for so that the backend's own count is recorded.
func chatRequest(req Request) openai.ChatRequest {
	cr := openai.ChatRequest{
		Model: req.Model, Messages: make([]openai.Message, len(req.Messages)),
		Stream: true, StreamOptions: &openai.StreamOptions{IncludeUsage: true},
	}
	for i, m := range req.Messages {
		cr.Messages[i] = openai.TextMessage(m.Role, m.Content)
	}
	if req.MaxTokens != 0 {
		// Zero leaves the cap to the backend.
		cr.MaxTokens = &req.MaxTokens
	}
	return cr
}

// Stream implements Streamer.
func (c *OpenAI) Stream(ctx context.Context, req Request, onDelta func(string) error) (Result, error) {
	endpoint := c.endpoints[int(c.next.Add(1)-1)%len(c.endpoints)]
	res := Result{Endpoint: endpoint}
	body, err := json.Marshal(chatRequest(req))
	if err != nil {
		return res, fmt.Errorf("encode chat request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return res, &Error{Endpoint: endpoint, Message: err.Error()}
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if c.apiKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		return res, &Error{Endpoint: endpoint, Message: err.Error(), Retryable: true}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return res, &Error{
			Endpoint: endpoint, Status: resp.StatusCode, Message: strings.TrimSpace(string(msg)),
			Retryable: resp.StatusCode == 408 || resp.StatusCode == 429 || resp.StatusCode >= 500,
		}
	}
	err = readStream(ctx, resp.Body, &res, onDelta)
	return res, err
}

// readStream reads an event stream into res, passing each piece of
// content to onDelta, until [DONE] or the end of the body. ctx is the
// request's: a body that breaks because the caller gave up is not the
// backend's failure.
func readStream(ctx context.Context, body io.Reader, res *Result, onDelta func(string) error) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue // comments, event names, blank separators
		}
		data := bytes.TrimSpace(line[len("data:"):])
		if bytes.Equal(data, []byte("[DONE]")) {
			return nil
		}
		var ev streamEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return &Error{Endpoint: res.Endpoint, Message: fmt.Sprintf("bad stream chunk %q: %v", truncate(data), err)}
		}
		if ev.Error != nil {
			return &Error{Endpoint: res.Endpoint, Message: ev.Error.Message}
		}
		if ev.Usage.Value != nil {
			res.Usage = *ev.Usage.Value
			res.UsageReported = true
		}
		for _, choice := range ev.Choices {
			if choice.Delta.Content != nil && *choice.Delta.Content != "" {
				res.Chunks++
				if err := onDelta(*choice.Delta.Content); err != nil {
					return err
				}
			}
			if choice.FinishReason != nil && *choice.FinishReason != "" {
				res.FinishReason = *choice.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &Error{Endpoint: res.Endpoint, Message: "stream broken: " + err.Error(), Retryable: true}
	}
	// Some servers end without [DONE]; a finish reason means the answer is complete.
	if res.FinishReason != "" {
		return nil
	}
	return &Error{Endpoint: res.Endpoint, Message: "stream ended without finish_reason or [DONE]", Retryable: true}
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}
