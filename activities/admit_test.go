package activities_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

func TestAdmitRoutesByPromptBound(t *testing.T) {
	cfg := config.Default()
	for _, tc := range []struct {
		name      string
		threshold int
		want      string
	}{
		{"default threshold", cfg.Routing.ShortThresholdTokens, request.PoolShort},
		{"tiny threshold", 10, request.PoolLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOptions) { o.shortThreshold = tc.threshold })
			out := h.admit(t, "r1", "granted")
			if out.Pool != tc.want {
				t.Fatalf("pool %q, want %q (bound %d, threshold %d)", out.Pool, tc.want, out.EstimatedPromptTokens, tc.threshold)
			}
			want := h.acts.Prompts.BoundBeforeRetrieval(query, cfg.Retrieval.TopK, cfg.Retrieval.ChunkTokens)
			if out.EstimatedPromptTokens != want {
				t.Fatalf("estimated prompt tokens %d, want %d", out.EstimatedPromptTokens, want)
			}
			if s := h.stats(t, tc.want); s.InUse != 1 {
				t.Fatalf("%s pool: %d permits in use, want 1", tc.want, s.InUse)
			}
		})
	}
}

func TestAdmitGrantsWhenFree(t *testing.T) {
	h := newHarness(t, nil)
	out := h.admit(t, "r1", "granted")
	if out.Pool != request.PoolShort || out.Position != 0 || out.Full {
		t.Fatalf("admit: %+v, want granted in short", out)
	}
	evs := h.events(t, "r1")
	if len(evs) != 1 || evs[0].Type != events.TypeStage {
		t.Fatalf("events: %+v, want one stage event", evs)
	}
	if st := decode[events.Stage](t, evs[0]); st.Stage != "admission" || st.Pool != request.PoolShort {
		t.Fatalf("stage event %+v, want admission in short", st)
	}
	if got := h.notifier.woken(); len(got) != 0 {
		t.Fatalf("woke %v, want nobody", got)
	}
}

func TestAdmitQueuesAndRechecksQuietly(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	out := h.admit(t, "waiter", "queued")
	if out.Position != 1 || out.Seq <= 0 || out.Pool != request.PoolShort {
		t.Fatalf("admit: %+v, want queued first in short with a seq", out)
	}
	evs := h.events(t, "waiter")
	if len(evs) != 2 || evs[0].Type != events.TypeStage || evs[1].Type != events.TypeQueue {
		t.Fatalf("events: %+v, want stage then queue", evs)
	}
	if q := decode[events.Queue](t, evs[1]); q.Position != 1 || q.Pool != request.PoolShort || q.EstimatedWaitMs != out.EstimatedWaitMs {
		t.Fatalf("queue event %+v, want position 1 in short, wait %d", q, out.EstimatedWaitMs)
	}

	re := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "waiter", Pool: out.Pool, Seq: out.Seq, Recheck: true,
	})
	if re.Granted || re.Full || re.Position != 1 || re.Seq != out.Seq || re.Pool != request.PoolShort {
		t.Fatalf("re-check: %+v, want still queued first with seq %d", re, out.Seq)
	}
	if n := len(h.events(t, "waiter")); n != 2 {
		t.Fatalf("re-check wrote events: %d now, want 2", n)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want 1 in use and 1 waiting", s)
	}
}

func TestAdmitFullQueue(t *testing.T) {
	h := newHarness(t, func(o *harnessOptions) { o.maxQueueDepth = 1 })
	h.admit(t, "holder", "granted")
	h.admit(t, "waiter", "queued")
	out := h.admit(t, "late", "full")
	if out.Granted || out.Position != 0 {
		t.Fatalf("admit: %+v, want full", out)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want the full request neither holding nor queued", s)
	}
	if q := ofType(h.events(t, "late"), events.TypeQueue); len(q) != 0 {
		t.Fatalf("queue events for a request that was not queued: %+v", q)
	}
}

func TestAdmitAfterReleaseIsGone(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "r1", "granted")
	if err := func() error {
		_, err := local[struct{}](t, h, h.acts.Finalize, activities.FinalizeInput{
			RequestID: "r1", Pool: request.PoolShort, EventType: events.TypeError,
			Failure: &events.Failure{Reason: "internal", Message: "x"},
		})
		return err
	}(); err != nil {
		t.Fatal(err)
	}
	_, err := local[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "r1", Pool: request.PoolShort, Recheck: true,
	})
	wantAppError(t, err, activities.ErrTypeCancelled, true)
	if s := h.stats(t, request.PoolShort); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("stats %+v: a released request took a place again", s)
	}
}

func TestAdmitWakesWaitersItGranted(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	h.admit(t, "waiter", "queued")
	// The holder's permit disappears without a release (as when its lease
	// ran out): the next Enqueue, by anyone, hands it to the waiter.
	if err := h.rdb.ZRem(context.Background(), h.prefix+"adm:{short}:permits", "holder").Err(); err != nil {
		t.Fatal(err)
	}
	out := h.admit(t, "late", "queued")
	if out.Position != 1 {
		t.Fatalf("late: %+v, want queued first behind the woken waiter", out)
	}
	if got, want := h.notifier.woken(), []string{"short/waiter"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "waiter"); !ok {
		t.Fatal("woken waiter holds no permit")
	}
}

// A request whose turn is near waits in Admit for its grant and is told at
// once when the holder ahead of it releases, without waiting for the
// signal; with nobody releasing it gives up after FastWait, still queued.
func TestAdmitFastWait(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	type result struct {
		out  activities.AdmitOutput
		err  error
		took time.Duration
	}
	admit := func(id string, fastWait time.Duration) <-chan result {
		done := make(chan result, 1)
		go func() {
			start := time.Now()
			out, err := local[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{RequestID: id, Query: query, FastWait: fastWait})
			done <- result{out, err, time.Since(start)}
		}()
		return done
	}
	done := admit("r1", 2*time.Second)
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	if _, err := local[struct{}](t, h, h.acts.Finalize, activities.FinalizeInput{RequestID: "holder", Pool: request.PoolShort}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !r.out.Granted {
		t.Fatalf("admit r1: %+v %v", r.out, r.err)
	}
	if d := time.Since(released); d > time.Second {
		t.Fatalf("r1 learned of its grant %v after the release: not from the announcement", d)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want r1 holding the permit", s)
	}
	h.notifier.mu.Lock()
	signalled := slices.Contains(h.notifier.calls, request.PoolShort+"/r1")
	h.notifier.mu.Unlock()
	if signalled {
		t.Fatal("r1 was signalled although it heard of its grant while waiting fast")
	}

	r = <-admit("r2", time.Second)
	if r.err != nil || r.out.Granted || r.out.Position != 1 {
		t.Fatalf("admit r2 with nobody releasing: %+v %v", r.out, r.err)
	}
	if r.took < time.Second {
		t.Fatalf("r2 gave up after %v, want FastWait", r.took)
	}
}

// Routing at the exact boundary: a prompt bound equal to the threshold is
// short, one token more is long.
func TestAdmitRoutesAtTheExactThreshold(t *testing.T) {
	cfg := config.Default()
	h := newHarness(t, nil)
	bound := h.acts.Prompts.BoundBeforeRetrieval(query, cfg.Retrieval.TopK, cfg.Retrieval.ChunkTokens)
	for _, tc := range []struct {
		threshold int
		want      string
	}{{bound, request.PoolShort}, {bound - 1, request.PoolLong}} {
		h := newHarness(t, func(o *harnessOptions) { o.shortThreshold = tc.threshold })
		if out := h.admit(t, "r1", "granted"); out.Pool != tc.want || out.EstimatedPromptTokens != bound {
			t.Fatalf("threshold %d: %+v, want pool %s at bound %d", tc.threshold, out, tc.want, bound)
		}
	}
	// A bound counted before (by the answer-cache lookup) is routed by as
	// given, not counted again.
	h = newHarness(t, func(o *harnessOptions) { o.shortThreshold = bound })
	out := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{RequestID: "r2", Query: query, PromptBound: bound + 1})
	if out.Pool != request.PoolLong || out.EstimatedPromptTokens != bound+1 {
		t.Fatalf("admit with a given bound: %+v; want the long pool at %d", out, bound+1)
	}
}

// The first admission queues at the door's place in the pool it was
// reserved in; a place reserved in another pool's order (the request was
// routed elsewhere) is given back, and the request queues anew.
func TestAdmitQueuesAtTheDoorsPlace(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	ctx := context.Background()
	place, _, err := h.gate.Reserve(ctx, request.PoolShort, "t", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	out := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "placed", Query: query, Tenant: "t", Weight: 1, Place: place,
	})
	if out.Granted || out.Seq != place.Tag {
		t.Fatalf("admit: %+v, want queued at the door's place %d", out, place.Tag)
	}
	elsewhere, _, err := h.gate.Reserve(ctx, request.PoolLong, "u", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	out = mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "routed", Query: query, Tenant: "u", Weight: 1, Place: elsewhere,
	})
	if out.Pool != request.PoolShort || out.Seq == elsewhere.Tag {
		t.Fatalf("admit: %+v, want queued anew in short, not at long's place %d", out, elsewhere.Tag)
	}
	if n, err := h.rdb.Keys(ctx, h.prefix+"*reserved").Result(); err != nil || len(n) != 0 {
		for _, k := range n {
			if v, _ := h.rdb.HGetAll(ctx, k).Result(); len(v) != 0 {
				t.Fatalf("places still reserved: %s %v", k, v)
			}
		}
	}
}

// A request's deadline reaches the queue: a priority request (1 s SLO) of
// the tenant's that comes after its flex one (none) takes the flex one's
// place, first in line.
func TestAdmitOrdersATenantsRequestsByDeadline(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	flex := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "flex", Query: query, Tenant: "t", Weight: 1,
	})
	prio := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "prio", Query: query, Tenant: "t", Weight: 5, Deadline: time.Now().Add(time.Second), SLO: time.Second,
	})
	if flex.Granted || prio.Granted || prio.Position != 1 || prio.Seq != flex.Seq {
		t.Fatalf("flex %+v, prio %+v: want prio first, at flex's place %d", flex, prio, flex.Seq)
	}
}
