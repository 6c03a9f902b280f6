package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// chatStream is one POST /v1/chat whose answer is an event stream.
type chatStream struct {
	resp *http.Response
	r    *testenv.SSEReader
	id   string
}

// httpError is a POST /v1/chat answered with a status other than 200.
type httpError struct {
	status int
	code   string // the body's error.code
}

func (e *httpError) Error() string { return fmt.Sprintf("HTTP %d %s", e.status, e.code) }

// postChat starts a chat request. A non-200 answer is an *httpError.
func postChat(ctx context.Context, hc *http.Client, baseURL, body string, header map[string]string) (*chatStream, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		return nil, &httpError{status: resp.StatusCode, code: e.Error.Code}
	}
	return &chatStream{resp: resp, r: testenv.NewSSEReader(resp.Body), id: resp.Header.Get("X-Request-ID")}, nil
}

// next returns the next event; io.EOF when the stream ended.
func (s *chatStream) next() (testenv.SSEEvent, error) { return s.r.Next() }

// until reads events until stop returns true for one, and returns it.
func (s *chatStream) until(stop func(testenv.SSEEvent) bool) (testenv.SSEEvent, error) {
	for {
		ev, err := s.r.Next()
		if err != nil {
			return ev, fmt.Errorf("stream of %s ended before the awaited event: %w", s.id, err)
		}
		if stop(ev) {
			return ev, nil
		}
	}
}

func (s *chatStream) close() { s.resp.Body.Close() }
