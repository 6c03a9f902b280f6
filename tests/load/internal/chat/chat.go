// Package chat is the bench's client of Sluice's POST /v1/chat: it sends a
// request, reads its event stream to the end and says what the client
// saw (an answer, a refusal, a hang); and the questions the scenarios
// ask.
package chat

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

// Stream is one POST /v1/chat whose answer is an event stream.
type Stream struct {
	resp *http.Response
	r    *testenv.SSEReader
	ID   string
}

// httpError is a POST /v1/chat answered with a status other than 200.
type httpError struct {
	status int
	code   string // the body's error.code
	// retryAfter is the Retry-After header in seconds (0: none).
	retryAfter int
}

func (e *httpError) Error() string { return fmt.Sprintf("HTTP %d %s", e.status, e.code) }

// Post starts a chat request. A non-200 answer is an *httpError.
func Post(ctx context.Context, hc *http.Client, baseURL, body string, header map[string]string) (*Stream, error) {
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
	return &Stream{resp: resp, r: testenv.NewSSEReader(resp.Body), ID: resp.Header.Get("X-Request-ID")}, nil
}

// next returns the next event; io.EOF when the stream ended.
func (s *Stream) next() (testenv.SSEEvent, error) { return s.r.Next() }

// Until reads events until stop returns true for one, and returns it.
func (s *Stream) Until(stop func(testenv.SSEEvent) bool) (testenv.SSEEvent, error) {
	for {
		ev, err := s.r.Next()
		if err != nil {
			return ev, fmt.Errorf("stream of %s ended before the awaited event: %w", s.ID, err)
		}
		if stop(ev) {
			return ev, nil
		}
	}
}

func (s *Stream) Close() { s.resp.Body.Close() }

// Outcome kinds of a chat request, besides "rejected <reason>",
// "error <reason>" and "HTTP <status> <code>".
const (
	KindDone = "done"
	// KindHang: no terminal event before the client gave up.
	KindHang = "hang"
)

// Result is what one chat request's client saw.
type Result struct {
	Kind string
	// ID is the request's workflow id; empty when none was started.
	ID     string
	Tokens int
	// Served is the done event's prompt plus completion tokens: what the
	// request was served, as its tenant's share counts it.
	Served int
	// Completion is the done event's completion tokens: the answer's
	// length as the backend counted it.
	Completion int
	// Pauses is the done event's pauses: how often the stream was
	// paused for a more urgent request.
	Pauses int
	// TTFT runs from the POST to the first token event (0: none came),
	// last to the last one: the answer's pace is what lies between.
	TTFT, Last time.Duration
	// Admitted runs from the POST to the first stage after admission
	// (retrieval, or the LLM call): the wait at the door and in the queue,
	// and the stages before them (0: never admitted).
	Admitted time.Duration
	// queued: the stream had a queue event, so the request waited for a
	// permit.
	Queued bool
	// RetryAfter is a rejection's retry_after_s, or a refusal's
	// Retry-After (0: none, or neither).
	RetryAfter int
}

// Read sends a chat request and reads every event of its stream up
// to the terminal one, or until ctx ends.
func Read(ctx context.Context, hc *http.Client, baseURL, body string, header map[string]string) Result {
	start := time.Now()
	s, err := Post(ctx, hc, baseURL, body, header)
	if err != nil {
		var he *httpError
		switch {
		case errors.As(err, &he):
			return Result{Kind: fmt.Sprintf("HTTP %d %s", he.status, he.code), RetryAfter: he.retryAfter}
		case ctx.Err() != nil:
			return Result{Kind: KindHang}
		}
		return Result{Kind: "transport error"}
	}
	defer s.Close()
	r := Result{ID: workflows.ChatWorkflowID(s.ID)}
	for {
		ev, err := s.next()
		if err != nil {
			r.Kind = "stream ended without a terminal event"
			if ctx.Err() != nil {
				r.Kind = KindHang
			}
			return r
		}
		switch ev.Event {
		case events.TypeQueue:
			r.Queued = true
		case events.TypeStage:
			var st events.Stage
			if r.Admitted == 0 && ev.Decode(&st) == nil && (st.Stage == request.StageRetrieval || st.Stage == request.StageLLM) {
				r.Admitted = time.Since(start)
			}
		case events.TypeToken:
			r.Last = time.Since(start)
			if r.Tokens == 0 {
				r.TTFT = r.Last
			}
			r.Tokens++
		case events.TypeDone:
			r.Kind = KindDone
			if r.Tokens == 0 {
				r.Kind = "done without tokens"
			}
			var d events.Done
			if ev.Decode(&d) == nil {
				r.Served, r.Completion = d.Usage.PromptTokens+d.Usage.CompletionTokens, d.Usage.CompletionTokens
				r.Pauses = d.Pauses
			}
			return r
		case events.TypeRejected, events.TypeError:
			var f events.Failure
			_ = ev.Decode(&f)
			r.Kind, r.RetryAfter = ev.Event+" "+f.Reason, f.RetryAfterS
			return r
		}
	}
}
