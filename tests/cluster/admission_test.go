package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
)

type notes struct {
	mu  sync.Mutex
	ids []string
}

func (n *notes) NotifyGranted(_ context.Context, _, id string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ids = append(n.ids, id)
	return false, nil
}

// Every admission script (enqueue, pump, release, renew, shed, stats,
// charge, pausable, preempt, yield) and the pipelines of the door's reads, on one pool's keys.
func TestAdmission(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	g, err := admission.New(rdb, admission.Options{KeyPrefix: prefix, Lease: 10 * time.Second, WaiterTTL: 10 * time.Second,
		MaxQueueDepth: 100, Limits: map[string]int{"short": 1}})
	ok(t, "new gate", err)
	r, err := g.Enqueue(ctx, "short", admission.Request{ID: "a", Tenant: "acme", Weight: 3})
	ok(t, "enqueue a", err)
	if r.Status != admission.Granted {
		t.Fatalf("a: %+v, want granted", r)
	}
	for _, req := range []admission.Request{
		{ID: "b", Tenant: "globex", Weight: 3, MaxConcurrent: 2},
		{ID: "c", Tenant: "initech", Weight: 1, MaxPerTenant: 5},
		{ID: "d", Tenant: "initech", Weight: 1},
	} {
		r, err := g.Enqueue(ctx, "short", req)
		ok(t, "enqueue "+req.ID, err)
		if r.Status != admission.Queued {
			t.Fatalf("%s: %+v, want queued", req.ID, r)
		}
	}
	held, err := g.Renew(ctx, "short", "a")
	ok(t, "renew", err)
	if !held {
		t.Fatal("a lost its permit")
	}
	ok(t, "keep alive", g.KeepAlive(ctx, "short", "b", time.Minute))
	_, _, err = g.Position(ctx, "short", "b")
	ok(t, "position", err)
	_, err = g.Stats(ctx, "short")
	ok(t, "stats", err)
	qs, err := g.QueueStats(ctx, "short")
	ok(t, "queue stats", err)
	if qs.Waiting != 3 || qs.InUse != 1 {
		t.Fatalf("queue stats %+v, want 1 in use and 3 waiting", qs)
	}
	_, _, err = g.Depth(ctx, "short", "initech")
	ok(t, "depth", err)
	_, err = g.Backlog(ctx, "short")
	ok(t, "backlog", err)
	shed, err := g.Shed(ctx, "short", admission.ShedOptions{Max: 1, Key: "once"})
	ok(t, "shed", err)
	if shed.Weight != 1 || len(shed.IDs) != 1 {
		t.Fatalf("shed %+v, want one of the weight-1 entries", shed)
	}
	again, err := g.Shed(ctx, "short", admission.ShedOptions{Max: 1, Key: "once"})
	ok(t, "shed again with its key", err)
	if len(again.IDs) != 1 || again.IDs[0] != shed.IDs[0] {
		t.Fatalf("a shed repeated with its key shed %+v, want the first's %+v", again, shed)
	}
	_, err = g.Pump(ctx, "short")
	ok(t, "pump", err)
	ok(t, "set limit", g.SetLimit(ctx, "short", 1))

	w, err := admission.NewWaker(ctx, rdb, g)
	ok(t, "new waker", err)
	defer w.Close()
	fast, err := w.Expect(ctx, "b", 10*time.Second)
	ok(t, "expect", err)
	rel, err := g.Release(ctx, "short", "a")
	ok(t, "release", err)
	if !rel.HeldPermit || len(admission.IDs(rel.Woken)) != 1 || admission.IDs(rel.Woken)[0] != "b" {
		t.Fatalf("release a: %+v, want its permit handed to b", rel)
	}
	n := &notes{}
	ok(t, "wake", admission.Wake(ctx, g, n, rel.Woken))
	select {
	case <-fast.C:
	case <-time.After(5 * time.Second):
		t.Fatal("b never heard of its grant")
	}
	granted, err := fast.End(ctx)
	ok(t, "end fast wait", err)
	if !granted || len(n.ids) != 0 {
		t.Fatalf("b granted %v, signalled %v; want granted over pub/sub, no signal", granted, n.ids)
	}
	// b streams: its tenant pays for its output as it comes.
	charged, err := g.Charge(ctx, "short", "b", 0.5)
	ok(t, "charge b's output", err)
	if charged <= 0 {
		t.Fatalf("charging b's output charged %d ticks, want some", charged)
	}
	// b, of the flex class, is paused for an urgent arrival, u: u gets
	// its permit, b queues again.
	_, err = g.Pausable(ctx, "short", "b", 2, 0, 100)
	ok(t, "offer b for pausing", err)
	r, err = g.Enqueue(ctx, "short", admission.Request{ID: "u", Tenant: "umbrella", Weight: 3})
	ok(t, "enqueue u", err)
	victim, err := g.Preempt(ctx, "short", "u", 0, admission.PauseRules{MinTokens: 1, MaxPauses: 1})
	ok(t, "preempt for u", err)
	if r.Status != admission.Queued || victim != "b" {
		t.Fatalf("u: %+v, victim %q; want queued, b asked to pause", r, victim)
	}
	y, err := g.Yield(ctx, "short", admission.YieldRequest{ID: "b", Weight: 3})
	ok(t, "yield b's permit", err)
	if !y.Paused || len(admission.IDs(y.Woken)) != 1 || admission.IDs(y.Woken)[0] != "u" {
		t.Fatalf("yield b: %+v, want paused, its permit to u", y)
	}
	r, err = g.Enqueue(ctx, "short", admission.Request{ID: "a", Tenant: "acme", Weight: 3})
	ok(t, "enqueue a released request", err)
	if r.Status != admission.Gone {
		t.Fatalf("a after its release: %+v, want gone", r)
	}

	// The janitor's watch of the process serving each pool: the master of
	// the pool's slot, whose run id differs from the other pool's when
	// their slots are on different masters.
	ids := map[string]string{}
	for _, pool := range []string{"short", "long"} {
		id, err := g.ServerOf(ctx, pool)
		ok(t, "find the redis serving "+pool, err)
		served, err := g.CheckServer(ctx, pool, id)
		ok(t, "note the redis serving "+pool, err)
		if served != admission.ServedLost {
			t.Fatalf("%s: first CheckServer = %v, want lost", pool, served)
		}
		if served, err = g.CheckServer(ctx, pool, id); err != nil || served != admission.ServedSame {
			t.Fatalf("%s: second CheckServer = %v, %v; want same", pool, served, err)
		}
		ids[pool] = id
	}
	t.Logf("pool short served by %s, long by %s", ids["short"], ids["long"])
}

// Pausing a stream of another pool of a group, for a waiter the group's
// budget holds back: preempt.lua reads every pool's permits, pausable
// and asked keys, and yield.lua grants in the waiter's pool, all in the
// group's slot.
func TestPreemptAcrossAGroup(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	g, err := admission.New(rdb, admission.Options{KeyPrefix: prefix, Lease: 10 * time.Second, WaiterTTL: 10 * time.Second,
		MaxQueueDepth: 100, Limits: map[string]int{"short": 2, "long": 2},
		Groups: []admission.Group{{Pools: []string{"short", "long"}, Limit: 2}}})
	ok(t, "new gate", err)
	for _, s := range []struct{ pool, id string }{{"long", "l"}, {"short", "s"}} {
		r, err := g.Enqueue(ctx, s.pool, admission.Request{ID: s.id, Tenant: "t-" + s.id, Weight: 1})
		ok(t, "enqueue "+s.id, err)
		if r.Status != admission.Granted {
			t.Fatalf("%s: %+v, want granted", s.id, r)
		}
		_, err = g.Pausable(ctx, s.pool, s.id, 2, 0, 100)
		ok(t, "offer "+s.id+" for pausing", err)
		time.Sleep(5 * time.Millisecond)
	}
	r, err := g.Enqueue(ctx, "short", admission.Request{ID: "u", Tenant: "umbrella", Weight: 1})
	ok(t, "enqueue u", err)
	victim, err := g.Preempt(ctx, "short", "u", 0, admission.PauseRules{MinTokens: 1, MaxPauses: 1})
	ok(t, "preempt for u", err)
	if r.Status != admission.Queued || victim != "l" {
		t.Fatalf("u: %+v, victim %q; want queued, long's l asked to pause", r, victim)
	}
	y, err := g.Yield(ctx, "long", admission.YieldRequest{ID: "l", Weight: 1})
	ok(t, "yield l's permit", err)
	if !y.Paused || len(y.Woken) != 1 || y.Woken[0] != (admission.Grant{Pool: "short", ID: "u"}) {
		t.Fatalf("yield l: %+v, want paused, the budget's permit to u in short", y)
	}
}
