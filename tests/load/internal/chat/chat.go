package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
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
	// retryAfter is the Retry-After header in seconds (0: none).
	retryAfter int
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
		retryAfter, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return nil, &httpError{status: resp.StatusCode, code: e.Error.Code, retryAfter: retryAfter}
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

// Outcome kinds of a chat request, besides "rejected <reason>",
// "error <reason>" and "HTTP <status> <code>".
const (
	kindDone = "done"
	// kindHang: no terminal event before the client gave up.
	kindHang = "hang"
)

// chatResult is what one chat request's client saw.
type chatResult struct {
	kind string
	// id is the request's workflow id; empty when none was started.
	id     string
	tokens int
	// served is the done event's prompt plus completion tokens: what the
	// request was served, as its tenant's share counts it.
	served int
	// ttft runs from the POST to the first token event (0: none came),
	// last to the last one: the answer's pace is what lies between.
	ttft, last time.Duration
	// admitted runs from the POST to the first stage after admission
	// (retrieval, or the LLM call): the wait at the door and in the queue,
	// and the stages before them (0: never admitted).
	admitted time.Duration
	// queued: the stream had a queue event, so the request waited for a
	// permit.
	queued bool
	// retryAfter is a rejection's retry_after_s, or a refusal's
	// Retry-After (0: none, or neither).
	retryAfter int
}

// readChat sends a chat request and reads every event of its stream up
// to the terminal one, or until ctx ends.
func readChat(ctx context.Context, hc *http.Client, baseURL, body string, header map[string]string) chatResult {
	start := time.Now()
	s, err := postChat(ctx, hc, baseURL, body, header)
	if err != nil {
		var he *httpError
		switch {
		case errors.As(err, &he):
			return chatResult{kind: fmt.Sprintf("HTTP %d %s", he.status, he.code), retryAfter: he.retryAfter}
		case ctx.Err() != nil:
			return chatResult{kind: kindHang}
		}
		return chatResult{kind: "transport error"}
	}
	defer s.close()
	r := chatResult{id: workflows.ChatWorkflowID(s.id)}
	for {
		ev, err := s.next()
		if err != nil {
			r.kind = "stream ended without a terminal event"
			if ctx.Err() != nil {
				r.kind = kindHang
			}
			return r
		}
		switch ev.Event {
		case events.TypeQueue:
			r.queued = true
		case events.TypeStage:
			var st events.Stage
			if r.admitted == 0 && ev.Decode(&st) == nil && (st.Stage == request.StageRetrieval || st.Stage == request.StageLLM) {
				r.admitted = time.Since(start)
			}
		case events.TypeToken:
			r.last = time.Since(start)
			if r.tokens == 0 {
				r.ttft = r.last
			}
			r.tokens++
		case events.TypeDone:
			r.kind = kindDone
			if r.tokens == 0 {
				r.kind = "done without tokens"
			}
			var d events.Done
			if ev.Decode(&d) == nil {
				r.served = d.Usage.PromptTokens + d.Usage.CompletionTokens
			}
			return r
		case events.TypeRejected, events.TypeError:
			var f events.Failure
			_ = ev.Decode(&f)
			r.kind, r.retryAfter = ev.Event+" "+f.Reason, f.RetryAfterS
			return r
		}
	}
}
