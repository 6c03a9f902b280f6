package multi

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/settle"
)

// settleBound is how long the stack may take, once the clients are
// done, to give back every permit and finish every workflow: a dead
// holder's lease (5 s) and a heartbeat timeout (4 s), with room for a
// busy machine.
const settleBound = time.Minute

// checkSettled fails the test for any permit held, queue place taken or
// chat workflow running once the stack has settled, and for any token
// reservation of the given tenants not refunded exactly once.
func checkSettled(t *testing.T, s *stack, tenants ...string) {
	t.Helper()
	for _, lost := range s.accounts().Leftovers(context.Background(), s.gate, settleBound, tenants...) {
		t.Errorf("left behind: %s", lost)
	}
}

// accounts checks the tiers' buckets (see multiConfig).
func (s *stack) accounts() *settle.Accounts {
	return &settle.Accounts{TC: s.tc, RDB: s.rdb, Namespace: s.cfg.Temporal.Namespace, KeyPrefix: s.cfg.Redis.KeyPrefix,
		TokenCapacity: tokenCapacity, RequestCapacity: requestCapacity}
}

// poolWatch samples, until its context ends, the short pool's permits in
// Redis (as every process sees them) and the requests the simulators run.
type poolWatch struct {
	done                          chan struct{}
	samples, maxInUse, maxRunning int
	// err is the first failed read of the pool, errs counts them.
	err  error
	errs int
}

func (s *stack) watchShortPool(ctx context.Context) *poolWatch {
	w := &poolWatch{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			st, err := s.gate.Stats(ctx, "short")
			if err != nil && ctx.Err() == nil {
				w.errs++
				if w.err == nil {
					w.err = err
				}
			}
			running := 0
			for _, sim := range s.sims {
				running += sim.Stats().Running
			}
			w.samples++
			w.maxInUse, w.maxRunning = max(w.maxInUse, st.InUse), max(w.maxRunning, running)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// check waits for the watch to end (its context must be done) and fails
// the test if more than the short pool's limit was ever in use or
// running at once.
func (w *poolWatch) check(t *testing.T) {
	t.Helper()
	<-w.done
	t.Logf("%d samples: at most %d short permits in use (limit %d), at most %d requests running on the simulators",
		w.samples, w.maxInUse, shortLimit, w.maxRunning)
	if w.err != nil {
		t.Errorf("read the short pool's permits: %v", w.err)
	}
	if w.maxInUse > shortLimit {
		t.Errorf("%d short permits in use at once; the limit is %d", w.maxInUse, shortLimit)
	}
	if w.maxRunning > shortLimit {
		t.Errorf("the simulators ran %d requests at once; the short pool's limit is %d", w.maxRunning, shortLimit)
	}
	if w.maxInUse == 0 {
		t.Error("no permit was ever seen in use: the watch saw no load")
	}
}

// TestNoOverAdmissionAcrossInstances sends forty requests at once, half
// through each API, to a pool of three permits that two workers admit
// from, and watches the permits in Redis and the requests the simulators
// run all along: never more than three at a time, whichever process
// admitted them.
func TestNoOverAdmissionAcrossInstances(t *testing.T) {
	s := stackFor(t)
	const clients = 40
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	w := s.watchShortPool(ctx)

	start := time.Now()
	results := make([]*chatclient.Result, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.send(context.Background(), s.apis[i%2], chatclient.Request{MaxTokens: 30, Bound: 90 * time.Second})
		}()
	}
	wg.Wait()
	took := time.Since(start)
	cancel()

	t.Logf("%d requests over 2 APIs and 2 workers in %s: %s", clients, took.Round(time.Millisecond), chatclient.Tally(results))
	w.check(t)
	for _, r := range results {
		if !r.OK() {
			t.Errorf("promise broken: %s", r.Summary())
		}
	}
	checkSettled(t, s, tenant)
}

// TestAPIKilledClientResumesOnTheOther starts a long answer through API
// 1, reads some of it, kills API 1 with SIGKILL, and resumes through API
// 2 after the last event id seen: the rest of the answer arrives, every
// token once and in order, and ends with done. API 1 is started again
// afterwards, on its address, for the tests that follow.
func TestAPIKilledClientResumesOnTheOther(t *testing.T) {
	s := stackFor(t)
	const before = 20
	api1, api2 := s.apis[0], s.apis[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if api1.Running() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.restartAPI(ctx, api1); err != nil {
			t.Errorf("restart %s: %v", api1.Name, err)
		}
	})

	start := time.Now()
	r := &chatclient.Result{}
	body, err := r.Post(ctx, s.http, api1.url, chatclient.Request{Key: nextKey(), MaxTokens: 400})
	if err != nil {
		t.Fatalf("post through %s: %v", api1.Name, err)
	}
	r.Read(body, before)
	if r.Tokens < before || r.Terminal != "" {
		body.Close()
		t.Fatalf("wanted %d tokens through %s before killing it, got %s", before, api1.Name, r.Summary())
	}
	if err := api1.Kill(); err != nil {
		t.Fatal(err)
	}
	// What was already in flight on the dead connection: read to its
	// end, counted like the rest (it belongs to the same stream).
	r.Read(body, -1)
	body.Close()
	cut := r.Tokens
	r.Err = nil
	t.Logf("%s: %d tokens read, then %s killed (last event id %s)", r.ID, cut, api1.Name, r.LastID)
	if r.Terminal != "" {
		t.Fatalf("the answer ended before %s was killed: %s; make it longer", api1.Name, r.Summary())
	}

	resumed, err := r.Resume(ctx, s.http, api2.url)
	if err != nil {
		t.Fatalf("through %s: %v", api2.Name, err)
	}
	r.Read(resumed, -1)
	resumed.Close()
	r.Took = time.Since(start)
	if ctx.Err() != nil && r.Terminal == "" {
		r.Hung = true
	}
	t.Logf("resumed on %s: %s, %d tokens after the cut, finish %q, %d completion tokens billed", api2.Name, r.Summary(), r.Tokens-cut, r.Finish, r.Completion)
	if r.Err != nil || r.Terminal != "done" || len(r.Violations) > 0 {
		t.Errorf("the resumed stream did not bring the whole answer once: %s", r.Summary())
	}
	if r.Tokens <= cut {
		t.Errorf("no token after the resume (%d before it)", cut)
	}
	if r.Completion != 0 && r.Completion != r.Tokens {
		t.Errorf("the client read %d tokens; the request was billed %d completion tokens", r.Tokens, r.Completion)
	}
	checkSettled(t, s, tenant)
}

// TestWorkerKilledActivitiesMove runs a closed loop of long answers
// through both APIs, kills worker 1 with SIGKILL mid-load, and checks
// that every request still ends (answered, or a terminal error such as
// stream_interrupted), that new requests are answered by worker 2 alone,
// that nothing is left in use, and that the usage ledger counts each
// request once. Worker 1 is started again afterwards.
func TestWorkerKilledActivitiesMove(t *testing.T) {
	s := stackFor(t)
	w1 := s.workers[0]
	t.Cleanup(func() {
		if !w1.Running() {
			if err := w1.Start(); err != nil {
				t.Errorf("restart %s: %v", w1.Name, err)
			}
		}
	})
	const clients = 8
	q := chatclient.Request{MaxTokens: 200, Bound: 2 * time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := s.watchShortPool(ctx)

	load := s.closedLoop(clients, q)
	time.Sleep(5 * time.Second)
	// Both workers take activities: worker 1 has some to lose.
	if n, err := s.activityPollers(ctx); err != nil || n < 2 {
		t.Errorf("before the kill, %d workers poll for activities (want 2): %v", n, err)
	}
	killedAt := time.Now()
	if err := w1.Kill(); err != nil {
		load.Stop()
		t.Fatal(err)
	}
	t.Logf("%s killed with %d clients running", w1.Name, clients)
	time.Sleep(10 * time.Second)
	during := load.Stop()
	cancel()
	t.Logf("during the load (%d requests, last one ended %s after the kill): %s",
		len(during), time.Since(killedAt).Round(time.Millisecond), chatclient.Tally(during))
	w.check(t)
	for _, r := range during {
		if !r.OK() {
			t.Errorf("promise broken: %s", r.Summary())
		}
	}

	// Only worker 2 is left: new requests through both APIs.
	var after []*chatclient.Result
	for i := range 6 {
		after = append(after, s.send(context.Background(), s.apis[i%2], chatclient.Request{MaxTokens: 20, Bound: time.Minute}))
	}
	t.Logf("after the kill, worker 2 alone: %s", chatclient.Tally(after))
	for _, r := range after {
		if r.Terminal != "done" || len(r.Violations) > 0 {
			t.Errorf("not answered with one worker left: %s", r.Summary())
		}
	}
	checkSettled(t, s, tenant)
	// The usage ledger (PostgreSQL) has each request once, the ones whose
	// finalisation the killed worker had begun included.
	checkLedgerOnce(t, s, append(during, after...))
}
