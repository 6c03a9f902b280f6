package admission

import (
	"context"
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// capped enqueues id for its tenant (tenantOf(id)) at weight 1 with a cap
// of cap permits held at once.
func capped(t *testing.T, g *Gate, id string, cap int) Result {
	t.Helper()
	return mustEnqueueReq(t, g, Request{ID: id, Tenant: tenantOf(id), Weight: 1, MaxConcurrent: cap})
}

func mustRelease(t *testing.T, g *Gate, id string) Released {
	t.Helper()
	rel, err := g.Release(context.Background(), "p", id)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// assertHeld checks each tenant's permits and the entries parked behind
// caps, as the admin view reads them.
func assertHeld(t *testing.T, g *Gate, held map[string]int, parked int) {
	t.Helper()
	st, err := g.QueueStats(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(st.HeldByTenant, held) || st.Parked != parked {
		t.Fatalf("held %v, parked %d; want %v, %d", st.HeldByTenant, st.Parked, held, parked)
	}
	backlog, err := g.Backlog(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	if backlog != st.Waiting-parked {
		t.Fatalf("backlog %d, want %d waiting less %d parked", backlog, st.Waiting, parked)
	}
	// Per tenant, as the metrics read it: a parked tenant's whole queue is
	// parked, and the rest is its backlog, which adds up to the pool's.
	sum := 0
	for tenant, n := range st.ParkedByTenant {
		sum += n
		if n != st.ByTenant[tenant] {
			t.Fatalf("tenant %s: %d parked of %d queued, want all", tenant, n, st.ByTenant[tenant])
		}
	}
	if sum != parked {
		t.Fatalf("parked by tenant %v, want %d in all", st.ParkedByTenant, parked)
	}
	sum = 0
	for tenant, n := range st.Backlog() {
		sum += n
		if st.ParkedByTenant[tenant] != 0 || n != st.ByTenant[tenant] {
			t.Fatalf("tenant %s: backlog %d of %d queued, %d parked", tenant, n, st.ByTenant[tenant], st.ParkedByTenant[tenant])
		}
	}
	if sum != backlog {
		t.Fatalf("backlog by tenant %v, want %d in all", st.Backlog(), backlog)
	}
}

// A tenant at its cap is passed by without losing its place: others are
// granted the free permits, and the tenant's first entry is granted the
// moment it gives one back, ahead of entries that came after it.
func TestConcurrencyCapPassesByAndKeepsPlace(t *testing.T) {
	g, rdb := newGate(t, 4, nil)
	// a's tier caps it at 2 permits; b's has no cap.
	cap := map[string]int{"a": 2, "b": 0}
	for _, id := range []string{"a-0", "b-0", "a-1", "b-1"} {
		if r := capped(t, g, id, cap[tenantOf(id)]); r.Status != Granted {
			t.Fatalf("%s: %v, want granted", id, r.Status)
		}
	}
	for _, id := range []string{"a-2", "b-2", "a-3", "b-3"} {
		if r := capped(t, g, id, cap[tenantOf(id)]); r.Status != Queued {
			t.Fatalf("%s: %v, want queued", id, r.Status)
		}
	}
	assertHeld(t, g, map[string]int{"a": 2, "b": 2}, 2)

	// b gives one back: a-2 is first in line but a is at its cap, so b-2
	// is granted past it.
	if rel := mustRelease(t, g, "b-0"); !slices.Equal(IDs(rel.Woken), []string{"b-2"}) {
		t.Fatalf("release b-0 woke %v, want [b-2] past capped a-2", rel.Woken)
	}
	if pos, ok, _ := g.Position(context.Background(), "p", "a-2"); !ok || pos != 1 {
		t.Fatalf("a-2 at %d (%v), want still first in line", pos, ok)
	}
	// a gives one back: its first entry goes next, ahead of b-3.
	if rel := mustRelease(t, g, "a-0"); !slices.Equal(IDs(rel.Woken), []string{"a-2"}) {
		t.Fatalf("release a-0 woke %v, want [a-2]", rel.Woken)
	}
	assertHeld(t, g, map[string]int{"a": 2, "b": 2}, 1)
	if rel := mustRelease(t, g, "b-1"); !slices.Equal(IDs(rel.Woken), []string{"b-3"}) {
		t.Fatalf("release b-1 woke %v, want [b-3]", rel.Woken)
	}
	assertHeld(t, g, map[string]int{"a": 2, "b": 2}, 1)
	for _, id := range []string{"a-1", "a-2", "b-2", "b-3", "a-3"} {
		mustRelease(t, g, id)
	}
	assertHeld(t, g, map[string]int{}, 0)
	assertNoQueueState(t, rdb, g)
}

// A tenant at its cap queues even when a permit is free and nobody else
// waits; a newcomer of another tenant is granted at once past it, and the
// door's backlog does not count the parked entry.
func TestConcurrencyCapAtEnqueue(t *testing.T) {
	g, rdb := newGate(t, 3, nil)
	if r := capped(t, g, "a-0", 1); r.Status != Granted {
		t.Fatalf("a-0: %v", r.Status)
	}
	if r := capped(t, g, "a-1", 1); r.Status != Queued || r.Position != 1 {
		t.Fatalf("a-1 over a's cap: %+v, want queued at 1 with 2 permits free", r)
	}
	assertHeld(t, g, map[string]int{"a": 1}, 1)
	if r := capped(t, g, "b-0", 1); r.Status != Granted {
		t.Fatalf("b-0: %v, want granted past the parked a-1", r.Status)
	}
	// The janitor's pump grants nothing: the only waiter is parked.
	if woken, err := g.Pump(context.Background(), "p"); err != nil || len(woken) != 0 {
		t.Fatalf("pump woke %v (%v), want nobody", woken, err)
	}
	if rel := mustRelease(t, g, "a-0"); !rel.HeldPermit || !slices.Equal(IDs(rel.Woken), []string{"a-1"}) {
		t.Fatalf("release a-0 = %+v, want a-1 woken", rel)
	}
	assertHeld(t, g, map[string]int{"a": 1, "b": 1}, 0)
	// A retried release gives nothing back twice.
	if rel := mustRelease(t, g, "a-0"); rel.HeldPermit || len(rel.Woken) != 0 {
		t.Fatalf("second release a-0 = %+v", rel)
	}
	assertHeld(t, g, map[string]int{"a": 1, "b": 1}, 0)
	mustRelease(t, g, "a-1")
	mustRelease(t, g, "b-0")
	assertNoQueueState(t, rdb, g)
}

// Every way a permit or an entry leaves keeps the counts exact: a lease
// that runs out gives its tenant's count back (and the parked entry is
// granted), a parked entry released or shed leaves the parked count, and a
// restored entry is parked again.
func TestConcurrencyCapCountsStayExact(t *testing.T) {
	ctx := context.Background()
	t.Run("lease expiry", func(t *testing.T) {
		g, rdb := newGate(t, 4, func(o *Options) { o.Lease = 200 * time.Millisecond })
		capped(t, g, "a-0", 1)
		capped(t, g, "a-1", 1)
		assertHeld(t, g, map[string]int{"a": 1}, 1)
		time.Sleep(300 * time.Millisecond)
		if ok, _ := g.Renew(ctx, "p", "a-0"); ok {
			t.Fatal("renewed an expired lease")
		}
		woken, err := g.Pump(ctx, "p")
		if err != nil || !slices.Equal(IDs(woken), []string{"a-1"}) {
			t.Fatalf("pump after expiry woke %v (%v), want [a-1]", woken, err)
		}
		assertHeld(t, g, map[string]int{"a": 1}, 0)
		// The holder's late release finds nothing: the count is not given
		// back twice.
		if rel := mustRelease(t, g, "a-0"); rel.HeldPermit {
			t.Fatalf("late release of an expired permit: %+v", rel)
		}
		assertHeld(t, g, map[string]int{"a": 1}, 0)
		mustRelease(t, g, "a-1")
		assertNoQueueState(t, rdb, g)
	})
	t.Run("release and shed parked", func(t *testing.T) {
		g, rdb := newGate(t, 4, nil)
		mustEnqueueReq(t, g, Request{ID: "f-0", Tenant: "f", Weight: 2, MaxConcurrent: 1})
		for _, id := range []string{"f-1", "f-2", "f-3"} {
			if r := mustEnqueueReq(t, g, Request{ID: id, Tenant: "f", Weight: 2, MaxConcurrent: 1}); r.Status != Queued {
				t.Fatalf("%s: %v", id, r.Status)
			}
		}
		mustEnqueueReq(t, g, Request{ID: "v-0", Tenant: "v", Weight: 5, MaxConcurrent: 1})
		mustEnqueueReq(t, g, Request{ID: "v-1", Tenant: "v", Weight: 5, MaxConcurrent: 1})
		assertHeld(t, g, map[string]int{"f": 1, "v": 1}, 4)
		if rel := mustRelease(t, g, "f-2"); !rel.WasQueued {
			t.Fatalf("release parked f-2 = %+v", rel)
		}
		assertHeld(t, g, map[string]int{"f": 1, "v": 1}, 3)
		res, err := g.Shed(ctx, "p", ShedOptions{})
		if err != nil || res.Weight != 2 || len(res.IDs) != 2 {
			t.Fatalf("shed %+v (%v), want f-1 and f-3", res, err)
		}
		assertHeld(t, g, map[string]int{"f": 1, "v": 1}, 1)
		if rel := mustRelease(t, g, "v-0"); !slices.Equal(IDs(rel.Woken), []string{"v-1"}) {
			t.Fatalf("release v-0 woke %v", rel.Woken)
		}
		mustRelease(t, g, "v-1")
		mustRelease(t, g, "f-0")
		assertNoQueueState(t, rdb, g)
	})
	t.Run("restore", func(t *testing.T) {
		g, rdb := newGate(t, 4, nil)
		capped(t, g, "a-0", 1)
		q := capped(t, g, "a-1", 1)
		dropEntry(t, rdb, g, "a-1")
		assertHeld(t, g, map[string]int{"a": 1}, 0)
		r := mustEnqueueReq(t, g, Request{ID: "a-1", Tenant: "a", Weight: 1, MaxConcurrent: 1, Seq: q.Seq})
		if r.Status != Queued || r.Seq != q.Seq {
			t.Fatalf("restored a-1 = %+v, want queued at its old tag", r)
		}
		assertHeld(t, g, map[string]int{"a": 1}, 1)
		if rel := mustRelease(t, g, "a-0"); !slices.Equal(IDs(rel.Woken), []string{"a-1"}) {
			t.Fatalf("release a-0 woke %v", rel.Woken)
		}
		mustRelease(t, g, "a-1")
		assertNoQueueState(t, rdb, g)
	})
}

// Parked entries cost a grant nothing: with 3,000 of one capped tenant's
// entries ahead of it (three times pump's budget), another tenant's
// request is granted by the next release.
func TestParkedEntriesDoNotStallGrants(t *testing.T) {
	g, rdb := newGate(t, 2, func(o *Options) { o.MaxQueueDepth = 10000 })
	capped(t, g, "a-000000", 1)
	capped(t, g, "h-0", 0)
	ctx := context.Background()
	// Queue the backlog in one round trip per 500, as 3,000 callers would.
	for from := 1; from <= 3000; from += 500 {
		pipe := rdb.Pipeline()
		k := g.keys("p")
		for i := from; i < from+500; i++ {
			enqueueScript.Run(ctx, pipe, g.scriptKeys("p"), withArgs([]any{fmt.Sprintf("a-%06d", i), "a", 1, 1, 0, 0,
				2, g.lease.Milliseconds(), 10000, time.Minute.Milliseconds(), k.alivePrefix, k.tombPrefix, 1, 0}, g.groupArgs("p"))...)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// b-0 is large enough (a unit for each of a's) to sort behind them all.
	if r := mustEnqueueReq(t, g, Request{ID: "b-0", Tenant: "b", Weight: 1, Cost: 3001}); r.Status != Queued || r.Position != 3001 {
		t.Fatalf("b-0 = %+v, want queued behind a's 3,000", r)
	}
	if rel := mustRelease(t, g, "h-0"); !slices.Equal(IDs(rel.Woken), []string{"b-0"}) {
		t.Fatalf("release h-0 woke %v, want [b-0] past 3,000 parked entries", rel.Woken)
	}
	assertHeld(t, g, map[string]int{"a": 1, "b": 1}, 3000)
}

// A queue written before heads existed (no order, heads or parked keys)
// is taken over: its waiters are granted in their order.
func TestOldQueueLayoutIsMigrated(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "holder")
	var want []string
	for i := 0; i < 450; i++ {
		id := fmt.Sprintf("%c-%06d", 'a'+i%3, i)
		mustEnqueueReq(t, g, Request{ID: id, Tenant: tenantOf(id), Weight: 1 + i%3})
	}
	want, _ = rdb.ZRange(ctx, g.keys("p").queue, 0, -1).Result()
	k := g.keys("p")
	if err := rdb.Del(ctx, k.order, k.heads, k.parked, k.held).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.HDel(ctx, k.stats, "layout", "parked")
	_, granted := serve(t, g, "holder", len(want))
	if !slices.Equal(granted, want) {
		t.Fatalf("after migration granted %v…, want the old queue's order %v…", granted[:5], want[:5])
	}
}

// Many concurrent requests of capped and uncapped tenants through a pool
// of 6: never more than 6 permits held, never more than a tenant's cap,
// everyone served, and every permit, entry and count given back.
func TestConcurrentNeverExceedsEitherCap(t *testing.T) {
	const limit, n = 6, 120
	g, rdb := newGate(t, limit, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tenants := []struct {
		name        string
		weight, cap int
	}{{"vip", 5, 0}, {"std", 3, 3}, {"free", 2, 1}, {"free2", 2, 2}}

	var mu sync.Mutex
	wake := map[string]chan struct{}{}
	for i := 0; i < n; i++ {
		wake[fmt.Sprint(i)] = make(chan struct{}, 1)
	}
	notify := func(ids []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			wake[id] <- struct{}{}
		}
	}
	var holding atomic.Int64
	held := make([]atomic.Int64, len(tenants))
	var served atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		id := fmt.Sprint(i)
		tn := i % len(tenants)
		req := Request{ID: id, Tenant: tenants[tn].name, Weight: tenants[tn].weight, MaxConcurrent: tenants[tn].cap}
		hold := time.Duration(rand.Intn(4)) * time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := g.Enqueue(ctx, "p", req)
			if err != nil {
				t.Error(err)
				return
			}
			notify(IDs(r.Woken))
			for r.Status != Granted {
				select {
				case <-wake[id]:
					r.Status = Granted
				case <-time.After(200 * time.Millisecond):
					req.Seq = r.Seq
					if r, err = g.Enqueue(ctx, "p", req); err != nil {
						t.Error(err)
						return
					}
					notify(IDs(r.Woken))
				case <-ctx.Done():
					t.Error("timed out waiting")
					return
				}
			}
			if h := holding.Add(1); h > limit {
				t.Errorf("%d permits held at once, limit %d", h, limit)
			}
			if c := tenants[tn].cap; c > 0 {
				if h := held[tn].Add(1); h > int64(c) {
					t.Errorf("%s holds %d permits at once, cap %d", tenants[tn].name, h, c)
				}
			}
			time.Sleep(hold)
			holding.Add(-1)
			if tenants[tn].cap > 0 {
				held[tn].Add(-1)
			}
			rel, err := g.Release(ctx, "p", id)
			if err != nil || !rel.HeldPermit {
				t.Errorf("release %s: %+v %v", id, rel, err)
			}
			served.Add(1)
			notify(IDs(rel.Woken))
		}()
	}
	wg.Wait()
	if served.Load() != n {
		t.Fatalf("served %d of %d", served.Load(), n)
	}
	assertHeld(t, g, map[string]int{}, 0)
	assertNoQueueState(t, rdb, g)
}

// Every key a script touches shares the pool's hash tag, so that a pool
// lives in one Redis Cluster slot.
func TestPoolKeysShareOneHashTag(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	k := g.keys("p")
	for _, key := range append(k.list(), k.alivePrefix+"x", k.tombPrefix+"x") {
		open := strings.IndexByte(key, '{')
		end := strings.IndexByte(key[open+1:], '}')
		if open < 0 || end < 0 || key[open+1:open+1+end] != "p" {
			t.Errorf("key %q is not tagged {p}", key)
		}
	}
}
