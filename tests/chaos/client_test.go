package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// request is what one client asks and how it behaves.
type request struct {
	// tenant sends it, with the tenant's next API key.
	tenant    string
	query     string
	maxTokens int
	// bound is how long the client waits for its terminal event before
	// it counts the request as hung.
	bound time.Duration
	// leaveAfter, if > 0, hangs up this long after sending.
	leaveAfter time.Duration
}

// result is what one client saw.
type result struct {
	id string
	// status is the HTTP status (0: no response); code and retryAfter
	// describe a refusal.
	status     int
	code       string
	retryAfter string
	err        error
	// terminal is the stream's terminal event, reason and retryAfterS its
	// failure's.
	terminal    string
	reason      string
	retryAfterS int
	tokens      int
	// violations are broken promises seen on the stream: a token out of
	// order or repeated, an event after the end, a second end.
	violations []string
	// left: the client hung up on purpose; hung: it waited its whole
	// bound without an end.
	left, hung bool
	start      time.Time
	took       time.Duration
}

// outcome is a result's class in a scenario's tally.
func (r result) outcome() string {
	switch {
	case r.hung:
		return "HUNG"
	case r.left:
		return "left"
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

func (r result) summary() string {
	s := fmt.Sprintf("%s %s: %s after %d tokens in %s", r.id, r.outcome(), r.terminal, r.tokens, r.took.Round(time.Millisecond))
	if r.err != nil {
		s += fmt.Sprintf(" (%v)", r.err)
	}
	if len(r.violations) > 0 {
		s += " violations: " + strings.Join(r.violations, "; ")
	}
	return s
}

// ok reports whether the client got what Sluice promises every client:
// tokens or a terminal event within its bound, nothing duplicated, and a
// Retry-After on every refusal worth retrying.
func (r result) ok() bool {
	switch {
	case r.hung || len(r.violations) > 0:
		return false
	case r.left:
		return true
	case r.err != nil:
		// The API process never goes down in these scenarios: a broken
		// connection is a client left without an answer.
		return false
	case r.status == http.StatusOK:
		// The stream ended with its terminal event, not cut short.
		return r.terminal != ""
	}
	return r.status < 500 || r.retryAfter != ""
}

const defaultQuery = "How does a token bucket refill?"

// send makes one chat request and reads its stream to the end, checking
// the stream's promises as it goes. It never fails the test, so that it
// can run in a goroutine.
func (s *stack) send(ctx context.Context, q request) result {
	if q.query == "" {
		q.query = defaultQuery
	}
	if q.bound == 0 {
		q.bound = time.Minute
	}
	r := result{start: time.Now()}
	ctx, cancel := context.WithTimeout(ctx, q.bound)
	defer cancel()
	var left atomic.Bool
	if q.leaveAfter > 0 {
		var leave context.CancelFunc
		ctx, leave = context.WithCancel(ctx)
		t := time.AfterFunc(q.leaveAfter, func() { left.Store(true); leave() })
		defer t.Stop()
	}
	r.send(ctx, s, q)
	r.took = time.Since(r.start)
	// A client that left before its end left; one that had its end
	// first did not.
	r.left = left.Load() && r.terminal == "" && (r.status == http.StatusOK || r.status == 0)
	if r.left {
		r.err = nil
	}
	if !r.left && r.terminal == "" && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.hung = true
	}
	return r
}

// send posts the request and reads the answer.
func (r *result) send(ctx context.Context, s *stack, q request) {
	body, _ := json.Marshal(map[string]any{"query": q.query, "max_tokens": q.maxTokens})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.baseURL+"/v1/chat", strings.NewReader(string(body)))
	if err != nil {
		r.err = err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.nextKey(q.tenant))
	resp, err := s.http.Do(req)
	if err != nil {
		r.err = err
		return
	}
	defer resp.Body.Close()
	r.status, r.id = resp.StatusCode, resp.Header.Get("X-Request-ID")
	if resp.StatusCode != http.StatusOK {
		r.retryAfter = resp.Header.Get("Retry-After")
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(raw, &e)
		r.code = e.Error.Code
		return
	}
	r.readStream(testenv.NewSSEReader(resp.Body))
}

// readStream reads events until the stream ends, recording the end and
// every broken promise.
func (r *result) readStream(sse *testenv.SSEReader) {
	for {
		ev, err := sse.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && r.terminal == "" {
				r.err = err
			}
			return
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
			r.tokens++
		case events.Terminal(ev.Event):
			r.terminal = ev.Event
			var f events.Failure
			if ev.Event != events.TypeDone && ev.Decode(&f) == nil {
				r.reason, r.retryAfterS = f.Reason, f.RetryAfterS
			}
		}
	}
}

// load is a closed loop of clients: each sends its next request as soon
// as its last one ended, until stop is closed. tenantOf names the tenant
// of each new request (it may change mid-run).
type load struct {
	mu      sync.Mutex
	results []result
	stop    chan struct{}
	done    sync.WaitGroup
}

func (s *stack) startLoad(clients int, tenantOf func() string, q request) *load {
	l := &load{stop: make(chan struct{})}
	for range clients {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				q := q
				q.tenant = tenantOf()
				r := s.send(context.Background(), q)
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
				if r.status != http.StatusOK || r.err != nil {
					// A refused client backs off a little, as a client
					// honouring Retry-After would.
					time.Sleep(200 * time.Millisecond)
				}
			}
		}()
	}
	return l
}

// finish stops sending and waits for every client's last request.
func (l *load) finish() []result {
	close(l.stop)
	l.done.Wait()
	return l.results
}

// tally counts results by outcome, e.g. "40 answered, 3 error
// stream_interrupted".
func tally(rs []result) string {
	counts := map[string]int{}
	for _, r := range rs {
		counts[r.outcome()]++
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return counts[names[i]] > counts[names[j]] })
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d %s", counts[n], n)
	}
	return strings.Join(parts, ", ")
}

// broken lists the results that broke a promise.
func broken(rs []result) []string {
	var out []string
	for _, r := range rs {
		if !r.ok() {
			out = append(out, r.summary())
		}
	}
	return out
}
