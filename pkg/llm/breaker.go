package llm

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Breaker configures the circuit breaker each endpoint of a pool has, so
// that the round robin skips a replica that is down, hanging or far
// slower than its peers. Zero fields take DefaultBreaker's values.
type Breaker struct {
	// Failures is how many failed streams in a row open an endpoint's
	// circuit. A stream fails when it cannot connect, gets a 5xx, passes
	// a deadline, breaks, or its first token is slower than
	// SlowFirstToken; a 4xx and the caller's own cancel or error do not
	// count either way.
	Failures int
	// OpenFor is how long an open circuit refuses streams. Then it is
	// half-open: one stream probes the endpoint, and its first token
	// closes the circuit again, its failure opens it for another OpenFor.
	OpenFor time.Duration
	// SlowFirstToken: a stream whose first token took longer counts as a
	// failure, which ejects an outlier replica. It counts only while
	// another endpoint of the pool is closed: a whole pool that is slow
	// is loaded, not broken, and ejecting its replicas would only make it
	// slower.
	SlowFirstToken time.Duration
}

// DefaultBreaker opens a circuit after five failures in a row, as
// Envoy's outlier detection does, and probes it again ten seconds later.
func DefaultBreaker() Breaker {
	return Breaker{Failures: 5, OpenFor: 10 * time.Second, SlowFirstToken: 10 * time.Second}
}

// CircuitState is an endpoint's circuit; its value is the gauge's.
type CircuitState int

// Circuit states.
const (
	CircuitClosed   CircuitState = 0
	CircuitHalfOpen CircuitState = 1
	CircuitOpen     CircuitState = 2
)

// Circuit is one endpoint's circuit as Circuits reports it.
type Circuit struct {
	// Endpoint is the endpoint's name (EndpointName).
	Endpoint string
	State    CircuitState
}

// ErrUnavailable matches (errors.Is) the *UnavailableError of a pool whose
// every endpoint refuses streams.
var ErrUnavailable = errors.New("llm: no endpoint available")

// UnavailableError is Stream's fast failure when every endpoint's circuit
// is open (or half-open with its probe already running): no request was
// sent.
type UnavailableError struct {
	Pool      string
	Endpoints int
	// RetryAfter is the time until the first circuit half-opens; 0 when
	// one is half-open and its probe is still running.
	RetryAfter time.Duration
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("llm pool %s: all %d endpoints have their circuit open; retry in %s", e.Pool, e.Endpoints, e.RetryAfter.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrUnavailable) hold.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// errNotCounted is the outcome of a stream that says nothing about its
// endpoint's health; the breaker excludes it.
var errNotCounted = errors.New("stream outcome not counted")

// errSlowFirstToken is the outcome of a stream whose first token was an
// outlier's.
var errSlowFirstToken = errors.New("slow first token")

// EndpointName is how metrics, logs and errors name the i-th endpoint of
// pool ("short-0"): never by its URL, which may carry credentials and
// names internal addresses.
func EndpointName(pool string, i int) string {
	if pool == "" {
		pool = "endpoint"
	}
	return fmt.Sprintf("%s-%d", pool, i)
}

// endpoint is one base URL of a pool with its circuit.
type endpoint struct {
	// name is EndpointName's; url is where requests go.
	name string
	url  string
	cb   *gobreaker.TwoStepCircuitBreaker[struct{}]
	// openedAt is when the circuit last opened (unix nanoseconds), for
	// the retry-after of an unavailable pool.
	openedAt atomic.Int64
}

func newEndpoint(name, url string, b Breaker, log *slog.Logger) *endpoint {
	ep := &endpoint{name: name, url: url}
	ep.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        name,
		MaxRequests: 1,
		Timeout:     b.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= uint32(b.Failures) },
		IsExcluded:  func(err error) bool { return errors.Is(err, errNotCounted) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				ep.openedAt.Store(time.Now().UnixNano())
				log.Warn("llm endpoint circuit opened", "endpoint", name, "from", from.String(), "open_for", b.OpenFor)
				return
			}
			log.Info("llm endpoint circuit changed", "endpoint", name, "from", from.String(), "to", to.String())
		},
	})
	return ep
}

func (ep *endpoint) state() CircuitState {
	switch ep.cb.State() {
	case gobreaker.StateClosed:
		return CircuitClosed
	case gobreaker.StateHalfOpen:
		return CircuitHalfOpen
	default:
		return CircuitOpen
	}
}

// ticket is one stream's pass through its endpoint's circuit. It reports
// the stream's outcome once: when the stream ends, or at its first token
// for the probe of a half-open circuit, so that a recovered endpoint takes
// traffic again without waiting for a whole answer, and for a slow first
// token.
type ticket struct {
	c        *OpenAI
	ep       *endpoint
	done     func(error)
	probe    bool
	slow     bool
	reported bool
}

// pick chooses the next endpoint round robin whose circuit lets a stream
// through. Endpoints it skips do not hand their turn to the one chosen:
// the turn after it starts past it, so the healthy endpoints share the
// skipped one's traffic evenly.
func (c *OpenAI) pick() (*ticket, error) {
	n := uint64(len(c.endpoints))
	start := c.next.Add(1) - 1
	for i := range n {
		ep := c.endpoints[(start+i)%n]
		probe := ep.cb.State() == gobreaker.StateHalfOpen
		done, err := ep.cb.Allow()
		if err != nil {
			continue
		}
		if i > 0 {
			c.next.Add(i)
		}
		return &ticket{c: c, ep: ep, done: done, probe: probe}, nil
	}
	return nil, c.unavailable()
}

// unavailable is the error of a pool none of whose endpoints takes a
// stream now.
func (c *OpenAI) unavailable() *UnavailableError {
	now := time.Now()
	retry := c.breaker.OpenFor
	for _, ep := range c.endpoints {
		halfOpens := time.Unix(0, ep.openedAt.Load()).Add(c.breaker.OpenFor)
		retry = min(retry, max(0, halfOpens.Sub(now)))
	}
	return &UnavailableError{Pool: c.name, Endpoints: len(c.endpoints), RetryAfter: retry}
}

// Circuits reports each endpoint's circuit, in the order of the options'
// endpoints.
func (c *OpenAI) Circuits() []Circuit {
	out := make([]Circuit, len(c.endpoints))
	for i, ep := range c.endpoints {
		out[i] = Circuit{Endpoint: ep.name, State: ep.state()}
	}
	return out
}

// firstToken notes how long the first token took. A probe's outcome is
// known now, and so is a slow first token's: reported at once, a slow
// replica is ejected after a few slow first tokens, not after as many
// whole answers at its pace while it keeps taking its share of streams.
func (t *ticket) firstToken(after time.Duration) {
	t.slow = after > t.c.breaker.SlowFirstToken
	if t.probe || t.slow {
		t.report(nil)
	}
}

// report gives the circuit the stream's outcome: nil (success), a failure,
// or errNotCounted. Later reports are ignored.
func (t *ticket) report(outcome error) {
	if t.reported {
		return
	}
	t.reported = true
	if outcome == nil && t.slow {
		outcome = errSlowFirstToken
		if !t.c.othersClosed(t.ep) {
			outcome = errNotCounted
		}
	}
	t.done(outcome)
}

// othersClosed reports whether an endpoint of the pool besides ep has its
// circuit closed.
func (c *OpenAI) othersClosed(ep *endpoint) bool {
	for _, other := range c.endpoints {
		if other != ep && other.state() == CircuitClosed {
			return true
		}
	}
	return false
}

// outcomeOf is what a stream's error says about its endpoint: only an
// *Error is the endpoint's doing, and a 4xx is the request's fault (or
// rate limiting), not a sign of a broken replica.
func outcomeOf(err error) error {
	var e *Error
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &e):
		return errNotCounted
	case e.Status >= 400 && e.Status < 500:
		return errNotCounted
	default:
		return err
	}
}
