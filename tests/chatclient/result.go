// Package chatclient is the streaming chat client of the suites that run
// a whole Sluice and break it (tests/chaos, tests/multi): it sends POST
// /v1/chat, reads the SSE answer checking what Sluice promises every
// client — tokens in order and each once, one terminal event, nothing
// after it, a Retry-After on a refusal worth retrying — and keeps
// closed loops of such clients running while a test injects its fault.
// A client never fails the test itself, so that it can run in a
// goroutine; the test judges its Result.
package chatclient

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
)

// Request is what one client asks and how it behaves.
type Request struct {
	// Key is the API key sent as the bearer token.
	Key       string
	Query     string
	MaxTokens int
	// ServiceTier is sent as service_tier when set.
	ServiceTier string
	// Bound is how long the client waits for its terminal event before
	// it counts the request as hung.
	Bound time.Duration
	// LeaveAfter, if > 0, hangs up this long after sending.
	LeaveAfter time.Duration
}

// DefaultQuery is the question of a Request without one.
const DefaultQuery = "How does a token bucket refill?"

// defaultBound is the Bound of a Request without one.
const defaultBound = time.Minute

func (q Request) withDefaults() Request {
	if q.Query == "" {
		q.Query = DefaultQuery
	}
	if q.Bound == 0 {
		q.Bound = defaultBound
	}
	return q
}

// Result is what one client saw, over one connection or several (a
// resumed stream).
type Result struct {
	ID  string
	Key string
	// Status is the HTTP status of the POST (0: no response); Code and
	// RetryAfter (the header) describe a refusal.
	Status     int
	Code       string
	RetryAfter string
	Err        error
	// Terminal is the stream's terminal event; Reason and RetryAfterS
	// are its failure's, Finish and Completion (completion tokens
	// billed) its done event's.
	Terminal    string
	Reason      string
	RetryAfterS int
	Finish      string
	Completion  int
	// Pauses is how often the answer was paused for a more urgent
	// request (its done event's).
	Pauses int
	Tokens int
	// LastID is the id of the last event read: where a resume starts.
	LastID string
	// Violations are broken promises seen on the stream: a token out of
	// order or repeated, an event after the end.
	Violations []string
	// Left: the client hung up on purpose (Request.LeaveAfter); Hung: it
	// waited its whole bound without an end.
	Left, Hung bool
	// Start is when the request was sent, Took how long it ran, TTFT how
	// long its first token took from Start.
	Start time.Time
	Took  time.Duration
	TTFT  time.Duration
	// MaxGap is the longest wait between two tokens.
	MaxGap    time.Duration
	lastToken time.Time
	// text is the answer as the tokens brought it (Answer).
	text strings.Builder
}

// Answer is the text of the tokens the client got, in order.
func (r *Result) Answer() string { return r.text.String() }

// End is when the client was done with the request.
func (r *Result) End() time.Time { return r.Start.Add(r.Took) }

// Outcome is a result's class in a tally.
func (r *Result) Outcome() string {
	switch {
	case r.Hung:
		return "HUNG"
	case r.Left:
		return "left"
	case r.Err != nil:
		return "connection error"
	case r.Status != http.StatusOK:
		return fmt.Sprintf("%d %s", r.Status, r.Code)
	case r.Terminal == events.TypeDone:
		return "answered"
	case r.Terminal == "":
		return "STREAM CUT"
	}
	return r.Terminal + " " + r.Reason
}

// Summary is one line on the result for a failure message.
func (r *Result) Summary() string {
	s := fmt.Sprintf("%s %s after %d tokens in %s", r.ID, r.Outcome(), r.Tokens, r.Took.Round(time.Millisecond))
	if r.Err != nil {
		s += fmt.Sprintf(" (%v)", r.Err)
	}
	if r.refusedWithoutRetryAfter() {
		s += " without Retry-After"
	}
	if len(r.Violations) > 0 {
		s += " violations: " + strings.Join(r.Violations, "; ")
	}
	return s
}

// OK reports whether the client got what Sluice promises every client:
// tokens or a terminal event within its bound, nothing duplicated, and a
// Retry-After on every refusal worth retrying.
func (r *Result) OK() bool {
	switch {
	case r.Hung || len(r.Violations) > 0:
		return false
	case r.Left:
		return true
	case r.Err != nil:
		// The API the client talks to stays up (a test that kills one
		// reads the cut stream with Read and judges it itself): a broken
		// connection is a client left without an answer.
		return false
	case r.Status == http.StatusOK:
		// The stream ended with its terminal event, not cut short.
		return r.Terminal != ""
	}
	return !r.refusedWithoutRetryAfter()
}

// refusedWithoutRetryAfter: a 5xx refusal is worth retrying, so it must
// say when.
func (r *Result) refusedWithoutRetryAfter() bool {
	return r.Status >= 500 && r.RetryAfter == ""
}

// Tally counts results by outcome, most first, e.g. "40 answered, 3
// error stream_interrupted".
func Tally(rs []*Result) string {
	counts := map[string]int{}
	var names []string
	for _, r := range rs {
		o := r.Outcome()
		if counts[o] == 0 {
			names = append(names, o)
		}
		counts[o]++
	}
	sort.SliceStable(names, func(i, j int) bool { return counts[names[i]] > counts[names[j]] })
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d %s", counts[n], n)
	}
	return strings.Join(parts, ", ")
}

// Broken summarises the results that are not OK.
func Broken(rs []*Result) []string {
	var out []string
	for _, r := range rs {
		if !r.OK() {
			out = append(out, r.Summary())
		}
	}
	return out
}
