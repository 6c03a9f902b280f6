package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// setPoolLimits sets both pools' permit counts for every instance, and
// puts the configured ones back when the test ends.
func setPoolLimits(t *testing.T, short, long int) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() {
		for pool, n := range map[string]int{"short": stack.cfg.Pools.Short.MaxConcurrency, "long": stack.cfg.Pools.Long.MaxConcurrency} {
			if err := stack.gate.SetLimit(ctx, pool, n); err != nil {
				t.Errorf("restore the %s pool's limit: %v", pool, err)
			}
		}
	})
	for pool, n := range map[string]int{"short": short, "long": long} {
		if err := stack.gate.SetLimit(ctx, pool, n); err != nil {
			t.Fatal(err)
		}
	}
}

// longQuery is a query whose prompt bound passes the short pool's
// threshold, so that it is routed to the long pool.
var longQuery = strings.TrimSpace(strings.Repeat("Why do leased permits protect the model servers from overload? ", 30))

// ending is how one client's request ended.
type ending struct {
	// status is the HTTP status of POST /v1/chat.
	status int
	// id is the request id (200 only); event and reason describe the
	// stream's terminal event, route the pool of a done one. event is
	// "left" for a client that hung up.
	id, event, reason, route string
	err                      error
}

const clientLeft = "left"

// send posts one chat request as tenant key and, when it is accepted,
// reads its stream to the terminal event, or hangs up after leaveAfter
// tokens if leaveAfter > 0. It never calls t.Fatal, so that it can run in
// its own goroutine.
func send(ctx context.Context, key, body string, leaveAfter int) ending {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, stack.baseURL+"/v1/chat", strings.NewReader(body))
	if err != nil {
		return ending{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ending{err: err}
	}
	defer resp.Body.Close()
	e := ending{status: resp.StatusCode, id: resp.Header.Get("X-Request-ID")}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		var body struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &body); err != nil || body.Error.Code == "" {
			e.err = fmt.Errorf("%d with a malformed error body: %s", resp.StatusCode, b)
		} else if resp.Header.Get("Retry-After") == "" {
			e.err = fmt.Errorf("%d without Retry-After: %s", resp.StatusCode, b)
		}
		e.reason = body.Error.Code
		return e
	}
	r := testenv.NewSSEReader(resp.Body)
	tokens := 0
	for {
		ev, err := r.Next()
		if err != nil {
			e.err = fmt.Errorf("stream of %s ended without a terminal event: %w", e.id, err)
			return e
		}
		if ev.Event == events.TypeToken {
			if tokens++; tokens == leaveAfter {
				e.event = clientLeft
				return e
			}
		}
		if events.Terminal(ev.Event) {
			e.event = ev.Event
			var f events.Failure
			var done events.Done
			switch {
			case ev.Event == events.TypeDone && ev.Decode(&done) == nil:
				e.route = done.Route
			case ev.Event != events.TypeDone && ev.Decode(&f) == nil:
				e.reason = f.Reason
			}
			return e
		}
	}
}

// A burst of 20× the permits: the LLM never has more than the permits'
// worth of Sluice's requests at once (running or waiting in its own
// queue), every client gets an answer or a clean refusal, and every permit
// and queue place is given back. A quarter of the clients hang up
// mid-answer: their permits must pass on only once their streams stopped.
func TestBurstNeverExceedsPermits(t *testing.T) {
	// Both pools share the simulator, so their permits add up. Few
	// permits keep the test short: the burst takes about 20 permit hold
	// times whatever P is, and fewer waiters load Temporal less with
	// their re-checks.
	const short, long = 2, 1
	const permits = short + long
	const clients = 20 * permits
	setPoolLimits(t, short, long)
	if st := stack.sim.Stats(); st.Running+st.Waiting != 0 {
		t.Fatalf("simulator busy before the burst: %+v", st)
	}

	// Sample what the simulator holds, and what the pools hand out, as
	// often as the machine allows, until the burst is over.
	var simMax, inUseMax, samples atomic.Int64
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Add(2)
	go func() {
		defer sampling.Done()
		for {
			select {
			case <-stopSampling:
				return
			default:
			}
			st := stack.sim.Stats()
			raise(&simMax, int64(st.Running+st.Waiting))
			samples.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	go func() {
		defer sampling.Done()
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(10 * time.Millisecond):
			}
			sum := 0
			for _, pool := range []string{"short", "long"} {
				qs, err := stack.gate.QueueStats(context.Background(), pool)
				if err != nil {
					t.Errorf("queue stats: %v", err)
					return
				}
				sum += qs.InUse
			}
			raise(&inUseMax, int64(sum))
		}
	}()
	stopSamplers := sync.OnceFunc(func() {
		close(stopSampling)
		sampling.Wait()
	})
	defer stopSamplers()

	// Every client gets a generous deadline, well past the tier's 45 s
	// queue wait; one that runs out is a hang.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	endings := make([]ending, clients)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range clients {
		query, maxTokens, leaveAfter := "How does a leased permit come back after a crash?", 16, 0
		if i%3 == 2 {
			query = longQuery
		}
		if i%4 == 1 {
			// Long enough to be still streaming when the disconnect grace
			// (1 s) runs out and the request cancels itself.
			maxTokens, leaveAfter = 200, 3
		}
		body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, query, maxTokens)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			endings[i] = send(ctx, "k-burst", body, leaveAfter)
		}()
	}
	close(gate)
	wg.Wait()
	took := time.Since(start)

	counts := map[string]int{}
	routes := map[string]int{}
	var accepted []string
	for i, e := range endings {
		switch {
		case e.err != nil:
			t.Errorf("client %d: %v", i, e.err)
		case e.status == http.StatusOK:
			accepted = append(accepted, e.id)
			switch e.event {
			case events.TypeDone:
				counts["done"]++
				routes[e.route]++
			case events.TypeRejected, events.TypeError:
				counts[e.event+":"+e.reason]++
			case clientLeft:
				counts[clientLeft]++
			default:
				t.Errorf("client %d ended with %q", i, e.event)
			}
		case e.status == http.StatusServiceUnavailable && (e.reason == "busy" || e.reason == request.ReasonQueueFull || e.reason == request.ReasonTenantQueueFull),
			e.status == http.StatusTooManyRequests:
			// Refused at the door, at once, with Retry-After: documented.
			counts[fmt.Sprint(e.status, " ", e.reason)]++
		default:
			// Includes 503 unavailable: a dependency failed under the burst.
			t.Errorf("client %d: unexpected %d %s", i, e.status, e.reason)
		}
	}
	// A workflow closes only after its finalize gave back what it held.
	outcomes := map[string]int{}
	for _, id := range accepted {
		outcomes[result(t, id).Outcome]++
	}
	stopSamplers()
	t.Logf("%d clients against %d permits in %v: %v, answered by pool %v, outcomes %v; simulator held at most %d (%d samples), permits in use at most %d",
		clients, permits, took.Round(time.Millisecond), counts, routes, outcomes, simMax.Load(), samples.Load(), inUseMax.Load())
	if n := outcomes[""]; n > 0 {
		t.Errorf("%d requests closed without an outcome", n)
	}

	if m := simMax.Load(); m > permits {
		t.Errorf("the simulator held %d of Sluice's requests at once; the pools' permits are %d", m, permits)
	}
	if m := inUseMax.Load(); m > permits {
		t.Errorf("%d permits in use at once; the pools' limits add up to %d", m, permits)
	}
	if counts["done"] < permits {
		t.Errorf("only %d requests were answered: the burst did not flow through (%v)", counts["done"], counts)
	}
	if routes["short"] == 0 || routes["long"] == 0 {
		t.Errorf("answers by pool %v: the burst must load both pools", routes)
	}
	if simMax.Load() == 0 {
		t.Error("the sampler never saw a request in the simulator")
	}
	for _, reason := range []string{request.ReasonInternal, request.ReasonBackendError, request.ReasonStreamInterrupted} {
		if n := counts[events.TypeError+":"+reason]; n > 0 {
			t.Errorf("%d requests failed with %s", n, reason)
		}
	}
	assertPoolsIdle(t)
	// The simulator drops a stream its client closed at its next step.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st := stack.sim.Stats()
		if st.Running+st.Waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("simulator still busy 5s after every request closed: %+v", st)
		}
	}
}

// raise sets m to v if v is larger.
func raise(m *atomic.Int64, v int64) {
	for {
		cur := m.Load()
		if v <= cur || m.CompareAndSwap(cur, v) {
			return
		}
	}
}
