package multi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// request is what one client asks.
type request struct {
	query     string
	maxTokens int
	// bound is how long the client waits for its terminal event before
	// it counts the request as hung.
	bound time.Duration
	// key is the API key to send with ("": the next of the multi
	// tenant's keys in turn).
	key string
	// leaveAfter, if > 0, hangs up this long after sending.
	leaveAfter time.Duration
}

// result is what one client saw, over one connection or several (a
// resumed stream).
type result struct {
	id  string
	key string
	// status is the HTTP status of the POST (0: no response); code names
	// a refusal.
	status int
	code   string
	err    error
	// terminal is the stream's terminal event, reason its failure's.
	terminal string
	reason   string
	// finish is the done event's finish reason, completion its count of
	// completion tokens.
	finish     string
	completion int
	tokens     int
	text       strings.Builder
	// lastID is the id of the last event read: where a resume starts.
	lastID string
	// violations are broken promises: a token out of order or repeated,
	// an event after the end.
	violations []string
	hung       bool
	// start is when the request was sent, ttft how long its first
	// token took from then.
	start time.Time
	ttft  time.Duration
	// left: the client hung up on purpose (request.leaveAfter).
	left bool
	took time.Duration
}

// outcome is a result's class in a tally.
func (r *result) outcome() string {
	switch {
	case r.left:
		return "left"
	case r.hung:
		return "HUNG"
	case r.err != nil:
		return "connection error"
	case r.status != http.StatusOK:
		return fmt.Sprintf("%d %s", r.status, r.code)
	case r.terminal == events.TypeDone:
		return "answered"
	case r.terminal == "":
		return "STREAM CUT"
	}
	return r.terminal + " " + r.reason
}

func (r *result) summary() string {
	s := fmt.Sprintf("%s %s after %d tokens in %s", r.id, r.outcome(), r.tokens, r.took.Round(time.Millisecond))
	if r.err != nil {
		s += fmt.Sprintf(" (%v)", r.err)
	}
	if len(r.violations) > 0 {
		s += " violations: " + strings.Join(r.violations, "; ")
	}
	return s
}

// ended reports whether the client got an end Sluice promises: a
// refusal, or a stream closed by its terminal event, nothing repeated.
func (r *result) ended() bool {
	if r.left {
		return len(r.violations) == 0
	}
	if r.hung || r.err != nil || len(r.violations) > 0 {
		return false
	}
	return r.status != http.StatusOK || r.terminal != ""
}

const defaultQuery = "How does a token bucket refill?"

var keyTurn atomic.Int64

// send makes one chat request through api and reads its stream to the
// end. It never fails the test, so that it can run in a goroutine.
func (s *stack) send(ctx context.Context, api *proc, q request) *result {
	if q.query == "" {
		q.query = defaultQuery
	}
	if q.bound == 0 {
		q.bound = time.Minute
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, q.bound)
	defer cancel()
	r := &result{key: q.key, start: start}
	if r.key == "" {
		r.key = apiKey(int(keyTurn.Add(1)))
	}
	var left atomic.Bool
	if q.leaveAfter > 0 {
		leave, stopLeave := context.WithCancel(ctx)
		defer stopLeave()
		ctx = leave
		timer := time.AfterFunc(q.leaveAfter, func() { left.Store(true); stopLeave() })
		defer timer.Stop()
	}
	body, err := r.post(ctx, s, api, q)
	if err == nil {
		r.read(body, -1)
		body.Close()
	}
	r.took = time.Since(start)
	if left.Load() && r.terminal == "" {
		r.left, r.err = true, nil
		return r
	}
	if r.terminal == "" && r.status == http.StatusOK && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.hung = true
	}
	return r
}

// post sends the chat request and returns the open stream of a 200.
func (r *result) post(ctx context.Context, s *stack, api *proc, q request) (io.ReadCloser, error) {
	body, _ := json.Marshal(map[string]any{"query": q.query, "max_tokens": q.maxTokens})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.url+"/v1/chat", strings.NewReader(string(body)))
	if err != nil {
		r.err = err
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+r.key)
	resp, err := s.http.Do(req)
	if err != nil {
		r.err = err
		return nil, err
	}
	r.status, r.id = resp.StatusCode, resp.Header.Get("X-Request-ID")
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(raw, &e)
		r.code = e.Error.Code
		return nil, fmt.Errorf("chat refused: %d %s", r.status, r.code)
	}
	return resp.Body, nil
}

// resume reconnects to the request's events through api after r.lastID
// and returns the open stream.
func (r *result) resume(ctx context.Context, s *stack, api *proc) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.url+"/v1/requests/"+r.id+"/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+r.key)
	req.Header.Set("Last-Event-ID", r.lastID)
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("resume %s on %s: %d %s", r.id, api.name, resp.StatusCode, raw)
	}
	return resp.Body, nil
}

// read reads events until the stream ends, or until the stream has
// brought maxTokens tokens in all (-1: no limit), recording the end and
// every broken promise. A connection error is kept in r.err unless the
// terminal event came first.
func (r *result) read(body io.Reader, maxTokens int) {
	sse := testenv.NewSSEReader(body)
	for maxTokens < 0 || r.tokens < maxTokens {
		ev, err := sse.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && r.terminal == "" {
				r.err = err
			}
			return
		}
		if ev.ID != "" {
			r.lastID = ev.ID
		}
		if r.terminal != "" {
			r.violations = append(r.violations, fmt.Sprintf("%s event after the terminal %s", ev.Event, r.terminal))
			continue
		}
		switch {
		case ev.Event == events.TypeToken:
			var tok events.Token
			if err := ev.Decode(&tok); err != nil || tok.Index != r.tokens {
				r.violations = append(r.violations, fmt.Sprintf("token with index %d after %d tokens (text repeated or lost)", tok.Index, r.tokens))
			}
			r.text.WriteString(tok.Text)
			if r.tokens == 0 && !r.start.IsZero() {
				r.ttft = time.Since(r.start)
			}
			r.tokens++
		case events.Terminal(ev.Event):
			r.terminal = ev.Event
			if ev.Event == events.TypeDone {
				var d events.Done
				_ = ev.Decode(&d)
				r.finish, r.completion = d.FinishReason, d.Usage.CompletionTokens
				continue
			}
			var f events.Failure
			if ev.Decode(&f) == nil {
				r.reason = f.Reason
			}
		}
	}
}

// tally counts results by outcome, e.g. "38 answered, 2 error
// stream_interrupted".
func tally(rs []*result) string {
	counts := map[string]int{}
	var order []string
	for _, r := range rs {
		o := r.outcome()
		if counts[o] == 0 {
			order = append(order, o)
		}
		counts[o]++
	}
	parts := make([]string, len(order))
	for i, o := range order {
		parts[i] = fmt.Sprintf("%d %s", counts[o], o)
	}
	return strings.Join(parts, ", ")
}
