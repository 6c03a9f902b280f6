package admission

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var (
	redisAddr string
	// gates numbers the gates a test process makes, so that every gate
	// gets fresh keys, also under -count=N.
	gates atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { redisAddr = r.Addr }))
}

func newGate(t *testing.T, limit int, mod func(*Options)) (*Gate, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := Options{
		KeyPrefix:     fmt.Sprintf("t:%s:%d:", t.Name(), gates.Add(1)),
		Lease:         10 * time.Second,
		WaiterTTL:     10 * time.Second,
		MaxQueueDepth: 1000,
		Limits:        map[string]int{"p": limit},
	}
	if mod != nil {
		mod(&opts)
	}
	g, err := New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return g, rdb
}

// mustEnqueue enqueues id for a tenant "t" of weight 1 with no tenant cap.
func mustEnqueue(t *testing.T, g *Gate, id string) Result {
	t.Helper()
	return mustEnqueueReq(t, g, Request{ID: id, Tenant: "t", Weight: 1})
}

func mustEnqueueReq(t *testing.T, g *Gate, req Request) Result {
	t.Helper()
	r, err := g.Enqueue(context.Background(), "p", req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestGrantThenQueueFIFO(t *testing.T) {
	g, _ := newGate(t, 2, nil)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if r := mustEnqueue(t, g, id); r.Status != Granted {
			t.Fatalf("%s: %v, want granted", id, r.Status)
		}
	}
	for i, id := range []string{"c", "d", "e"} {
		r := mustEnqueue(t, g, id)
		if r.Status != Queued || r.Position != i+1 {
			t.Fatalf("%s: %v at %d, want queued at %d", id, r.Status, r.Position, i+1)
		}
	}
	// Asking again is idempotent: same place, no new entry.
	if r := mustEnqueue(t, g, "d"); r.Status != Queued || r.Position != 2 {
		t.Fatalf("re-enqueue d: %+v", r)
	}
	rel, err := g.Release(ctx, "p", "a")
	if err != nil {
		t.Fatal(err)
	}
	if !rel.HeldPermit || len(rel.Woken) != 1 || IDs(rel.Woken)[0] != "c" {
		t.Fatalf("release a = %+v, want permit handed to c", rel)
	}
	if r := mustEnqueue(t, g, "c"); r.Status != Granted {
		t.Fatalf("c after hand-off: %v", r.Status)
	}
	if pos, ok, _ := g.Position(ctx, "p", "e"); !ok || pos != 2 {
		t.Fatalf("e position %d %v, want 2", pos, ok)
	}
	// A second release of a frees nothing.
	rel, _ = g.Release(ctx, "p", "a")
	if rel.HeldPermit || rel.WasQueued || len(rel.Woken) != 0 {
		t.Fatalf("second release a = %+v, want no-op", rel)
	}
	// Releasing a queued request removes its entry and wakes nobody.
	rel, _ = g.Release(ctx, "p", "d")
	if rel.HeldPermit || !rel.WasQueued || len(rel.Woken) != 0 {
		t.Fatalf("release queued d = %+v", rel)
	}
	st, err := g.Stats(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if st.InUse != 2 || st.Waiting != 1 || st.Limit != 2 {
		t.Fatalf("stats %+v, want 2 in use, 1 waiting", st)
	}
}

func TestNewArrivalDoesNotJumpQueue(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "a")
	mustEnqueue(t, g, "b") // waits
	// The holder's permit vanishes without a release (as after a crash and
	// lease expiry); a newcomer must queue behind b, and b gets the slot.
	rdb.ZRem(ctx, g.keys("p").permits, "a")
	r := mustEnqueue(t, g, "c")
	if r.Status != Queued || r.Position != 1 || len(r.Woken) != 1 || IDs(r.Woken)[0] != "b" {
		t.Fatalf("c = %+v, want queued at 1 with b woken", r)
	}
}

func TestExpiredLeaseReturnsPermit(t *testing.T) {
	g, _ := newGate(t, 1, func(o *Options) { o.Lease = 150 * time.Millisecond })
	ctx := context.Background()
	mustEnqueue(t, g, "crashed")
	if r := mustEnqueue(t, g, "w"); r.Status != Queued {
		t.Fatalf("w: %v", r.Status)
	}
	if woken, _ := g.Pump(ctx, "p"); len(woken) != 0 {
		t.Fatalf("pump before expiry woke %v", woken)
	}
	time.Sleep(300 * time.Millisecond)
	woken, err := g.Pump(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(woken) != 1 || woken[0].ID != "w" {
		t.Fatalf("pump after expiry woke %v, want [w]", woken)
	}
	if ok, _ := g.Renew(ctx, "p", "crashed"); ok {
		t.Fatal("renew of an expired permit succeeded")
	}
	if ok, _ := g.Renew(ctx, "p", "w"); !ok {
		t.Fatal("renew of a held permit failed")
	}
}

func TestRenewKeepsPermit(t *testing.T) {
	g, _ := newGate(t, 1, func(o *Options) { o.Lease = 200 * time.Millisecond })
	ctx := context.Background()
	mustEnqueue(t, g, "h")
	mustEnqueue(t, g, "w")
	for i := 0; i < 5; i++ {
		time.Sleep(80 * time.Millisecond)
		if ok, err := g.Renew(ctx, "p", "h"); err != nil || !ok {
			t.Fatalf("renew %d: %v %v", i, ok, err)
		}
	}
	if woken, _ := g.Pump(ctx, "p"); len(woken) != 0 {
		t.Fatalf("renewed permit was reclaimed: woke %v", woken)
	}
}

func TestZombieWaiterSkipped(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "h")
	mustEnqueue(t, g, "dead")
	mustEnqueue(t, g, "live")
	rdb.Del(ctx, g.keys("p").alivePrefix+"dead") // its waiter is gone
	rel, _ := g.Release(ctx, "p", "h")
	if len(rel.Woken) != 1 || IDs(rel.Woken)[0] != "live" {
		t.Fatalf("woken %v, want [live]", rel.Woken)
	}
	if _, ok, _ := g.Position(ctx, "p", "dead"); ok {
		t.Fatal("zombie still queued")
	}
}

func TestRestoreKeepsPlace(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "h")
	first := mustEnqueue(t, g, "x")
	mustEnqueue(t, g, "y")
	// x's entry is lost (dropped as a zombie while its worker was down).
	dropEntry(t, rdb, g, "x")
	r, err := g.Enqueue(ctx, "p", Request{ID: "x", Tenant: "t", Weight: 1, Seq: first.Seq})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != Queued || r.Position != 1 {
		t.Fatalf("restored x at %d (%v), want 1", r.Position, r.Status)
	}
}

// After a release, no late or retried Enqueue can take the request back
// in: it would hold a permit or place nobody will ever return.
func TestReleasedRequestCannotReenter(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "h")
	q := mustEnqueue(t, g, "w")
	if _, err := g.Release(ctx, "p", "w"); err != nil {
		t.Fatal(err)
	}
	// A stale re-check with the old seq, and a first call that arrives
	// after the release, both find the tombstone.
	for _, seq := range []int64{q.Seq, 0} {
		r, err := g.Enqueue(ctx, "p", Request{ID: "w", Tenant: "t", Weight: 1, Seq: seq})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != Gone {
			t.Fatalf("enqueue after release (seq %d): %v, want released", seq, r.Status)
		}
	}
	if _, ok, _ := g.Position(ctx, "p", "w"); ok {
		t.Fatal("released request is queued again")
	}
	rel, _ := g.Release(ctx, "p", "h")
	if len(rel.Woken) != 0 {
		t.Fatalf("a released request was woken: %v", rel.Woken)
	}
	// Releasing a request that was never admitted also blocks it.
	if _, err := g.Release(ctx, "p", "never"); err != nil {
		t.Fatal(err)
	}
	if r := mustEnqueue(t, g, "never"); r.Status != Gone {
		t.Fatalf("enqueue after a release-first: %v", r.Status)
	}
}

func TestQueueFull(t *testing.T) {
	g, _ := newGate(t, 1, func(o *Options) { o.MaxQueueDepth = 2 })
	mustEnqueue(t, g, "h")
	mustEnqueue(t, g, "q1")
	mustEnqueue(t, g, "q2")
	if r := mustEnqueue(t, g, "q3"); r.Status != Full {
		t.Fatalf("q3: %v, want full", r.Status)
	}
	// A waiter already in the queue can still re-check.
	if r := mustEnqueue(t, g, "q2"); r.Status != Queued {
		t.Fatalf("q2 re-check: %v", r.Status)
	}
}

func TestSetLimit(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "a")
	if r := mustEnqueue(t, g, "b"); r.Status != Queued {
		t.Fatal("b not queued")
	}
	if err := g.SetLimit(ctx, "p", 3); err != nil {
		t.Fatal(err)
	}
	woken, _ := g.Pump(ctx, "p")
	if len(woken) != 1 || woken[0].ID != "b" {
		t.Fatalf("after raising limit woke %v", woken)
	}
	if r := mustEnqueue(t, g, "c"); r.Status != Granted || r.Limit != 3 {
		t.Fatalf("c = %+v", r)
	}
	if err := g.SetLimit(ctx, "p", 0); err == nil {
		t.Fatal("limit 0 accepted")
	}
	if _, err := g.Enqueue(ctx, "nope", Request{ID: "x", Tenant: "t", Weight: 1}); err == nil {
		t.Fatal("unknown pool accepted")
	}
}

func TestMeanHoldAndEstimate(t *testing.T) {
	g, _ := newGate(t, 2, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "a")
	time.Sleep(50 * time.Millisecond)
	if _, err := g.Release(ctx, "p", "a"); err != nil {
		t.Fatal(err)
	}
	st, _ := g.Stats(ctx, "p")
	if st.MeanHold < 40*time.Millisecond || st.MeanHold > 5*time.Second {
		t.Fatalf("mean hold %v after a ~50ms hold", st.MeanHold)
	}
	if got := EstimateWait(4, 2, time.Second); got != 2*time.Second {
		t.Fatalf("EstimateWait(4, 2, 1s) = %v", got)
	}
}

// Many concurrent requests of tenants with different weights through a
// gate of 3: never more than 3 hold a permit, everyone is served, and every
// permit, entry and tenant count is returned.
func TestConcurrentNeverExceedsLimit(t *testing.T) {
	const limit, n = 3, 60
	g, rdb := newGate(t, limit, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tiers := []struct {
		tenant string
		weight int
	}{{"vip", 5}, {"std", 3}, {"free", 2}, {"free2", 2}}

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
	var holding, maxHolding, served atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		id := fmt.Sprint(i)
		tier := tiers[i%len(tiers)]
		req := Request{ID: id, Tenant: tier.tenant, Weight: tier.weight}
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
					// Fallback re-check, as a workflow does on its timer.
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
			h := holding.Add(1)
			for {
				m := maxHolding.Load()
				if h <= m || maxHolding.CompareAndSwap(m, h) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			holding.Add(-1)
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
	if m := maxHolding.Load(); m > limit {
		t.Fatalf("%d held permits at once, limit %d", m, limit)
	}
	st, _ := g.Stats(ctx, "p")
	if st.InUse != 0 || st.Waiting != 0 {
		t.Fatalf("leftover state %+v", st)
	}
	assertNoQueueState(t, rdb, g)
}

// assertNoQueueState checks that an empty queue, with no permit held,
// left no bookkeeping behind: every tenant's count came back to zero.
func assertNoQueueState(t *testing.T, rdb *redis.Client, g *Gate) {
	t.Helper()
	k := g.keys("p")
	ctx := context.Background()
	for _, key := range []string{
		k.queue, k.tenants, k.finish, k.waiters, k.since, k.weights,
		k.order, k.heads, k.held, k.parked, k.charged, k.deadlines, k.ranks, k.credit, k.shift,
	} {
		if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
			t.Errorf("%s left behind (%d, %v)", key, n, err)
		}
	}
	if n, err := rdb.HGet(ctx, k.stats, "parked").Int(); err != nil && err != redis.Nil || n != 0 {
		t.Errorf("stats say %d entries parked (%v), want 0", n, err)
	}
}

// dropScript removes a queue entry as the pump drops a zombie, through the
// same lib.lua code, but wherever the entry is in the queue.
var dropScript = redis.NewScript(prelude + `
unqueue(ARGV[1])
redis.call('DEL', ARGV[2] .. ARGV[1])
return 0`)

func dropEntry(t *testing.T, rdb *redis.Client, g *Gate, id string) {
	t.Helper()
	k := g.keys("p")
	if err := dropScript.Run(context.Background(), rdb, g.scriptKeys("p"), id, k.alivePrefix).Err(); err != nil {
		t.Fatal(err)
	}
}

// backlog enqueues n requests of tenant named tenant-<i>; all must queue.
func backlog(t *testing.T, g *Gate, tenant string, weight, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		r := mustEnqueueReq(t, g, Request{ID: fmt.Sprintf("%s-%06d", tenant, i), Tenant: tenant, Weight: weight})
		if r.Status != Queued {
			t.Fatalf("%s-%d: %v, want queued", tenant, i, r.Status)
		}
	}
}

// serve runs a gate of one permit n times: the holder releases and the
// permit passes to the next waiter, who becomes the holder. It returns the
// new holder and the ids granted, in order.
func serve(t *testing.T, g *Gate, holder string, n int) (string, []string) {
	t.Helper()
	granted := make([]string, 0, n)
	for i := 0; i < n; i++ {
		rel, err := g.Release(context.Background(), "p", holder)
		if err != nil {
			t.Fatal(err)
		}
		if !rel.HeldPermit || len(rel.Woken) != 1 {
			t.Fatalf("grant %d: release of %s = %+v, want the permit handed on", i, holder, rel)
		}
		holder = IDs(rel.Woken)[0]
		granted = append(granted, holder)
	}
	return holder, granted
}

func tenantOf(id string) string { return id[:strings.LastIndexByte(id, '-')] }

func count(ids []string, tenant string) int {
	n := 0
	for _, id := range ids {
		if tenantOf(id) == tenant {
			n++
		}
	}
	return n
}

// With weights 5:3:2 and three deep backlogs, grants split 50/30/20, and
// each tenant's requests are granted in the order they arrived.
func TestFairSharesFollowWeights(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
	tenants := []struct {
		name   string
		weight int
		share  float64
	}{{"vip", 5, 0.5}, {"std", 3, 0.3}, {"free", 2, 0.2}}
	// Arrivals interleave, as they would from many clients.
	for i := 0; i < 300; i++ {
		for _, tn := range tenants {
			backlog(t, g, tn.name, tn.weight, i, 1)
		}
	}
	_, granted := serve(t, g, "h-0", 500)
	for _, tn := range tenants {
		got := float64(count(granted, tn.name)) / float64(len(granted))
		t.Logf("%s (weight %d): %.1f%% of %d grants", tn.name, tn.weight, 100*got, len(granted))
		if math.Abs(got-tn.share) > 0.05 {
			t.Errorf("%s got %.1f%% of grants, want %.0f%% ± 5", tn.name, 100*got, 100*tn.share)
		}
	}
	// Every window is fair too, not just the total: over any 100 grants
	// each share stays within 5 points.
	for start := 0; start+100 <= len(granted); start += 50 {
		w := granted[start : start+100]
		for _, tn := range tenants {
			if got := float64(count(w, tn.name)) / 100; math.Abs(got-tn.share) > 0.05 {
				t.Errorf("grants %d..%d: %s got %.0f%%, want %.0f%% ± 5", start, start+100, tn.name, 100*got, 100*tn.share)
			}
		}
	}
	last := map[string]string{}
	for _, id := range granted {
		tn := tenantOf(id)
		if id <= last[tn] {
			t.Fatalf("%s granted after %s: order inversion within tenant %s", id, last[tn], tn)
		}
		last[tn] = id
	}
}

// One tenant's burst of 1,000 does not push another tenant's single
// request behind it.
func TestBurstDoesNotBuryOtherTenant(t *testing.T) {
	g, _ := newGate(t, 1, func(o *Options) { o.MaxQueueDepth = 5000 })
	mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
	backlog(t, g, "burst", 3, 0, 1000)
	r := mustEnqueueReq(t, g, Request{ID: "single-0", Tenant: "single", Weight: 3})
	if r.Status != Queued || r.Position > 2 {
		t.Fatalf("single request: %v at %d, want queued near the head", r.Status, r.Position)
	}
	_, granted := serve(t, g, "h-0", 3)
	if count(granted, "single") != 1 {
		t.Fatalf("first grants %v, want single-0 among them", granted)
	}
}

// A tenant back from idle starts at the pool's virtual time: it gets its
// weight's share at once, neither a burst of credit for the time it was
// away nor a wait behind the others' backlog.
func TestIdleTenantBanksNoCredit(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
	backlog(t, g, "a", 1, 0, 20)
	backlog(t, g, "b", 1, 0, 400)
	// a is served until it runs dry, then b alone moves V a long way.
	holder, granted := serve(t, g, "h-0", 140)
	if n := count(granted, "a"); n != 20 {
		t.Fatalf("a got %d of its 20 in phase 1", n)
	}
	backlog(t, g, "a", 1, 20, 100)
	_, granted = serve(t, g, holder, 40)
	if n := count(granted, "a"); n < 18 || n > 22 {
		t.Fatalf("a back from idle got %d of 40 grants, want its equal share of 20 ± 2: %v", n, granted)
	}
	if tenantOf(granted[0]) != "a" && tenantOf(granted[1]) != "a" {
		t.Fatalf("a back from idle waited: %v", granted[:4])
	}
}

// Entries a tenant gave up (timed out, cancelled) leave it no debt: once
// it has nothing queued, its next request starts at V again.
func TestAbandonedEntriesLeaveNoDebt(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
	backlog(t, g, "b", 1, 0, 100)
	backlog(t, g, "a", 1, 0, 50)
	for i := 0; i < 50; i++ {
		if rel, err := g.Release(ctx, "p", fmt.Sprintf("a-%06d", i)); err != nil || !rel.WasQueued {
			t.Fatalf("release a-%d: %+v %v", i, rel, err)
		}
	}
	r := mustEnqueueReq(t, g, Request{ID: "a-000050", Tenant: "a", Weight: 1})
	if r.Status != Queued || r.Position > 2 {
		t.Fatalf("a after giving up its entries: %v at %d, want near the head", r.Status, r.Position)
	}
}

// Equal tags (same weight, same virtual start) keep arrival order, whatever
// the request ids; 40 tenants tie, more than one window of free_tick.
func TestTiesKeepArrivalOrder(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
	var ids []string
	for i := 40; i > 0; i-- {
		ids = append(ids, fmt.Sprintf("t%02d-0", i))
	}
	for i, id := range ids {
		r := mustEnqueueReq(t, g, Request{ID: id, Tenant: tenantOf(id), Weight: 2})
		if r.Position != i+1 {
			t.Fatalf("%s at %d, want %d", id, r.Position, i+1)
		}
	}
	_, granted := serve(t, g, "h-0", len(ids))
	if !slices.Equal(granted, ids) {
		t.Fatalf("granted %v, want arrival order %v", granted, ids)
	}
}

// Tags stay exact integers far into a pool's life: Lua numbers, ZSET
// scores and the stored V are all doubles, exact up to 2^53.
func TestVirtualTimeStaysExact(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	const v = int64(1) << 50
	rdb.HSet(ctx, g.keys("p").stats, "vtime", v)
	mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
	a := mustEnqueueReq(t, g, Request{ID: "a-0", Tenant: "a", Weight: 1})
	b := mustEnqueueReq(t, g, Request{ID: "b-0", Tenant: "b", Weight: 1})
	if a.Seq != v+2520 || b.Seq != v+2521 {
		t.Fatalf("tags %d, %d; want %d, %d", a.Seq, b.Seq, v+2520, v+2521)
	}
	serve(t, g, "h-0", 1)
	if got, err := rdb.HGet(ctx, g.keys("p").stats, "vtime").Int64(); err != nil || got != v+2520 {
		t.Fatalf("V = %d (%v), want %d", got, err, v+2520)
	}
}

func TestTenantCap(t *testing.T) {
	ctx := context.Background()
	// setup holds the one permit and queues a-0 and a-1, the cap of a, then
	// checks that a third request of a is refused while b still queues.
	setup := func(t *testing.T) (*Gate, *redis.Client) {
		g, rdb := newGate(t, 1, nil)
		mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
		for i := 0; i < 2; i++ {
			if r := mustEnqueueReq(t, g, Request{ID: fmt.Sprint("a-", i), Tenant: "a", Weight: 1, MaxPerTenant: 2}); r.Status != Queued {
				t.Fatalf("a-%d: %v", i, r.Status)
			}
		}
		if r := mustEnqueueReq(t, g, Request{ID: "a-2", Tenant: "a", Weight: 1, MaxPerTenant: 2}); r.Status != TenantFull {
			t.Fatalf("a-2 over the cap: %v, want tenant_full", r.Status)
		}
		if r := mustEnqueueReq(t, g, Request{ID: "b-0", Tenant: "b", Weight: 1, MaxPerTenant: 2}); r.Status != Queued {
			t.Fatalf("b-0: %v, want queued while a is full", r.Status)
		}
		// A waiter already queued can still re-check at the cap.
		if r := mustEnqueueReq(t, g, Request{ID: "a-1", Tenant: "a", Weight: 1, MaxPerTenant: 2}); r.Status != Queued {
			t.Fatalf("a-1 re-check: %v", r.Status)
		}
		assertDepth(t, g, map[string]int{"a": 2, "b": 1})
		return g, rdb
	}
	// reopen checks that a has room for exactly one more.
	reopen := func(t *testing.T, g *Gate) {
		t.Helper()
		if r := mustEnqueueReq(t, g, Request{ID: "a-3", Tenant: "a", Weight: 1, MaxPerTenant: 2}); r.Status != Queued {
			t.Fatalf("a-3 after one of a left: %v, want queued", r.Status)
		}
		if r := mustEnqueueReq(t, g, Request{ID: "a-4", Tenant: "a", Weight: 1, MaxPerTenant: 2}); r.Status != TenantFull {
			t.Fatalf("a-4: %v, want tenant_full", r.Status)
		}
	}

	t.Run("grant", func(t *testing.T) {
		g, _ := setup(t)
		if _, granted := serve(t, g, "h-0", 1); granted[0] != "a-0" {
			t.Fatalf("granted %v, want a-0", granted)
		}
		assertDepth(t, g, map[string]int{"a": 1, "b": 1})
		reopen(t, g)
	})
	t.Run("release", func(t *testing.T) {
		g, _ := setup(t)
		if rel, _ := g.Release(ctx, "p", "a-1"); !rel.WasQueued {
			t.Fatalf("release a-1 = %+v", rel)
		}
		assertDepth(t, g, map[string]int{"a": 1, "b": 1})
		reopen(t, g)
	})
	t.Run("zombie", func(t *testing.T) {
		g, rdb := setup(t)
		rdb.Del(ctx, g.keys("p").alivePrefix+"a-0")
		// a-0 is at the head: the pump drops it and grants b-0, the next.
		if _, granted := serve(t, g, "h-0", 1); granted[0] != "b-0" {
			t.Fatalf("granted %v, want b-0 past the zombie", granted)
		}
		assertDepth(t, g, map[string]int{"a": 1})
		reopen(t, g)
	})
}

func assertDepth(t *testing.T, g *Gate, want map[string]int) {
	t.Helper()
	st, err := g.QueueStats(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(st.ByTenant, want) {
		t.Fatalf("depth by tenant %v, want %v", st.ByTenant, want)
	}
}

// A restored entry takes back its own tag, so it sits among other tenants'
// entries exactly where it was.
func TestRestoreAmongTenants(t *testing.T) {
	ctx := context.Background()
	t.Run("middle", func(t *testing.T) {
		g, rdb := newGate(t, 1, nil)
		mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
		seqs := map[string]int64{}
		for i := 0; i < 3; i++ {
			for _, tn := range []struct {
				name   string
				weight int
			}{{"a", 5}, {"b", 3}, {"c", 2}} {
				id := fmt.Sprintf("%s-%d", tn.name, i)
				seqs[id] = mustEnqueueReq(t, g, Request{ID: id, Tenant: tn.name, Weight: tn.weight}).Seq
			}
		}
		before, _, _ := g.Position(ctx, "p", "b-1")
		dropEntry(t, rdb, g, "b-1")
		if _, ok, _ := g.Position(ctx, "p", "b-1"); ok {
			t.Fatal("b-1 still queued after the drop")
		}
		assertDepth(t, g, map[string]int{"a": 3, "b": 2, "c": 3})
		r := mustEnqueueReq(t, g, Request{ID: "b-1", Tenant: "b", Weight: 3, Seq: seqs["b-1"]})
		if r.Status != Queued || r.Position != before || r.Seq != seqs["b-1"] {
			t.Fatalf("restored b-1 = %+v, want queued at %d with seq %d", r, before, seqs["b-1"])
		}
		assertDepth(t, g, map[string]int{"a": 3, "b": 3, "c": 3})
		// b keeps FIFO: its next request still comes after b-2.
		r = mustEnqueueReq(t, g, Request{ID: "b-3", Tenant: "b", Weight: 3})
		if r.Seq <= seqs["b-2"] {
			t.Fatalf("b-3 tag %d not after b-2's %d", r.Seq, seqs["b-2"])
		}
	})
	t.Run("head", func(t *testing.T) {
		g, rdb := newGate(t, 1, nil)
		mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
		a0 := mustEnqueueReq(t, g, Request{ID: "a-0", Tenant: "a", Weight: 1})
		for _, id := range []string{"b-0", "a-1", "b-1"} {
			mustEnqueueReq(t, g, Request{ID: id, Tenant: tenantOf(id), Weight: 1})
		}
		// a-0's waiter missed its re-checks; the pump drops it on the way
		// to b-0, and V moves past its tag.
		rdb.Del(ctx, g.keys("p").alivePrefix+"a-0")
		holder, granted := serve(t, g, "h-0", 1)
		if granted[0] != "b-0" {
			t.Fatalf("granted %v, want b-0", granted)
		}
		r := mustEnqueueReq(t, g, Request{ID: "a-0", Tenant: "a", Weight: 1, Seq: a0.Seq})
		if r.Status != Queued || r.Position != 1 {
			t.Fatalf("restored a-0 = %+v, want the head", r)
		}
		if _, granted = serve(t, g, holder, 3); !slices.Equal(granted, []string{"a-0", "a-1", "b-1"}) {
			t.Fatalf("granted %v", granted)
		}
	})
}

func TestQueueStats(t *testing.T) {
	g, _ := newGate(t, 2, nil)
	ctx := context.Background()
	st, err := g.QueueStats(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if st.Limit != 2 || st.InUse != 0 || st.Waiting != 0 || st.OldestWait != 0 || len(st.ByTenant) != 0 {
		t.Fatalf("empty pool: %+v", st)
	}
	mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1})
	mustEnqueueReq(t, g, Request{ID: "h-1", Tenant: "h", Weight: 1})
	mustEnqueueReq(t, g, Request{ID: "a-0", Tenant: "a", Weight: 2})
	time.Sleep(30 * time.Millisecond)
	mustEnqueueReq(t, g, Request{ID: "b-0", Tenant: "b", Weight: 2})
	mustEnqueueReq(t, g, Request{ID: "a-1", Tenant: "a", Weight: 2})
	st, err = g.QueueStats(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if st.InUse != 2 || st.Waiting != 3 || !maps.Equal(st.ByTenant, map[string]int{"a": 2, "b": 1}) {
		t.Fatalf("stats %+v", st)
	}
	if !maps.Equal(st.HeldByTenant, map[string]int{"h": 2}) || len(st.ParkedByTenant) != 0 || !maps.Equal(st.Backlog(), st.ByTenant) {
		t.Fatalf("held %v, parked %v, backlog %v: want h's 2 permits, nobody parked, the whole queue backlogged",
			st.HeldByTenant, st.ParkedByTenant, st.Backlog())
	}
	if st.OldestWait < 25*time.Millisecond || st.OldestWait > 5*time.Second {
		t.Fatalf("oldest wait %v, want about 30ms", st.OldestWait)
	}
	if _, err := g.QueueStats(ctx, "nope"); err == nil {
		t.Fatal("unknown pool accepted")
	}
}

func TestEnqueueRejectsBadRequest(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	for _, req := range []Request{
		{ID: "", Tenant: "t", Weight: 1},
		{ID: "x", Tenant: "t"},
		{ID: "x", Tenant: "t", Weight: -1},
		{ID: "x", Tenant: "t", Weight: 1, Cost: -1},
		{ID: "x", Tenant: "t", Weight: 1, Cost: math.NaN()},
		{ID: "x", Tenant: "t", Weight: 1, MaxPerTenant: -1},
	} {
		if _, err := g.Enqueue(context.Background(), "p", req); err == nil {
			t.Errorf("%+v accepted", req)
		}
	}
}

// BenchmarkGrantRelease is one request's admission round trip on a free
// pool: grant at once, then release.
func BenchmarkGrantRelease(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g, err := New(rdb, Options{KeyPrefix: fmt.Sprintf("bench:%d:", gates.Add(1)), Lease: 30 * time.Second, WaiterTTL: 30 * time.Second, MaxQueueDepth: 1000, Limits: map[string]int{"p": 1 << 20}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	testenv.ResetServerStats(b, rdb)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprint("r", i)
		if r, err := g.Enqueue(ctx, "p", Request{ID: id, Tenant: "t", Weight: 3}); err != nil || r.Status != Granted {
			b.Fatalf("enqueue %s: %+v %v", id, r, err)
		}
		if _, err := g.Release(ctx, "p", id); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	testenv.ReportScriptTime(b, rdb)
}

// BenchmarkEnqueueReleaseWFQ is the saturated path: one permit, a standing
// queue of three tenants weighted 5:3:2; each op queues one request and
// releases the holder, which hands the permit to the fair-queue head.
func BenchmarkEnqueueReleaseWFQ(b *testing.B) {
	for _, depth := range []int{300, 3000} {
		b.Run(fmt.Sprint("depth=", depth), func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
			defer rdb.Close()
			g, err := New(rdb, Options{
				KeyPrefix: fmt.Sprintf("bench-wfq:%d:", gates.Add(1)), Lease: time.Minute, WaiterTTL: time.Hour,
				MaxQueueDepth: 1 << 20, Limits: map[string]int{"p": 1},
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			weights := []int{5, 3, 2}
			enqueue := func(i int) Result {
				r, err := g.Enqueue(ctx, "p", Request{ID: fmt.Sprint("r", i), Tenant: fmt.Sprint("t", i%3), Weight: weights[i%3]})
				if err != nil {
					b.Fatal(err)
				}
				return r
			}
			holder := "holder"
			if _, err := g.Enqueue(ctx, "p", Request{ID: holder, Tenant: "h", Weight: 1}); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < depth; i++ {
				enqueue(i)
			}
			testenv.ResetServerStats(b, rdb)
			b.ResetTimer()
			for i := depth; i < depth+b.N; i++ {
				if r := enqueue(i); r.Status != Queued {
					b.Fatalf("r%d: %v", i, r.Status)
				}
				rel, err := g.Release(ctx, "p", holder)
				if err != nil || len(rel.Woken) != 1 {
					b.Fatalf("release %s: %+v %v", holder, rel, err)
				}
				holder = IDs(rel.Woken)[0]
			}
			b.StopTimer()
			testenv.ReportScriptTime(b, rdb)
			_ = rdb.Del(ctx, g.keys("p").list()...).Err()
		})
	}
}

// pumpRun is one round of the emulated janitor.
type pumpRun struct {
	// before and after are Redis's clock (ms, as the scripts read it) just
	// before the Pump call was sent and just after it returned, so the
	// script itself ran at a time in [before, after].
	before, after int64
	woken         []string
	// returned is when the call returned, on this process's clock.
	returned time.Time
}

// startJanitor emulates the workers' janitor (Worker.RunJanitor in
// worker/worker.go, which pumps every pool every second) at a faster
// poll: Pump every poll until the test ends, reporting every round.
func startJanitor(t *testing.T, g *Gate, rdb *redis.Client, poll time.Duration) <-chan pumpRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runs := make(chan pumpRun, 1024)
	stopped := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-stopped
	})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(poll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			before, err := rdb.Time(ctx).Result()
			var woken []Grant
			if err == nil {
				woken, err = g.Pump(ctx, "p")
			}
			var after time.Time
			if err == nil {
				after, err = rdb.Time(ctx).Result()
			}
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("janitor: %v", err)
				}
				return
			}
			select {
			case runs <- pumpRun{before: before.UnixMilli(), after: after.UnixMilli(), woken: IDs(woken), returned: time.Now()}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return runs
}

// renewEvery renews id's permit every period, as a streaming holder does,
// until stop is called or the test ends, failing the test if the permit is
// ever lost. Calling stop stands for the holder crashing.
func renewEvery(t *testing.T, g *Gate, id string, period time.Duration) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	stop = func() {
		cancel()
		<-stopped
	}
	t.Cleanup(stop)
	go func() {
		defer close(stopped)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ok, err := g.Renew(ctx, "p", id)
			if ctx.Err() != nil {
				return
			}
			if err != nil || !ok {
				t.Errorf("renew of live holder %s: %v %v", id, ok, err)
				return
			}
		}
	}()
	return stop
}

// A holder that stops renewing (it crashed, or hangs) loses its permit
// when its lease runs out, and the janitor's next poll hands it to the
// next waiter: within lease + one poll, never before the lease ends, and
// only that permit (a holder that keeps renewing keeps its own).
func TestCrashedHolderPermitReturnsWithinLeasePlusOnePoll(t *testing.T) {
	// The lease is short but well above the poll, so that the checks after
	// the grant run long before the new holder's own lease could end.
	const (
		lease = time.Second
		poll  = 100 * time.Millisecond
	)
	g, rdb := newGate(t, 2, func(o *Options) { o.Lease = lease })
	ctx := context.Background()
	for _, id := range []string{"live", "dead"} {
		if r := mustEnqueue(t, g, id); r.Status != Granted {
			t.Fatalf("%s: %v, want granted", id, r.Status)
		}
	}
	for i, id := range []string{"w", "w2"} {
		if r := mustEnqueue(t, g, id); r.Status != Queued || r.Position != i+1 {
			t.Fatalf("%s: %+v, want queued at %d", id, r, i+1)
		}
	}
	renewEvery(t, g, "live", lease/6)
	runs := startJanitor(t, g, rdb, poll)

	// dead renews a few times, as a healthy stream does, then stops.
	var lastRenew time.Time
	for i := 0; i < 3; i++ {
		time.Sleep(lease / 6)
		lastRenew = time.Now()
		if ok, err := g.Renew(ctx, "p", "dead"); err != nil || !ok {
			t.Fatalf("renew %d of dead before it stopped: %v %v", i, ok, err)
		}
	}
	// The lease's end on Redis's clock; the scripts compare against it.
	expiry, err := rdb.ZScore(ctx, g.keys("p").permits, "dead").Result()
	if err != nil {
		t.Fatalf("dead's permit is gone before its lease ended: %v", err)
	}
	end := int64(expiry)

	deadline := time.After(10 * time.Second)
	pollsAfterEnd := 0
	var grant pumpRun
	for grant.woken == nil {
		select {
		case <-deadline:
			t.Fatalf("w not granted 10s after the lease ended (%d pumps after it)", pollsAfterEnd)
		case run := <-runs:
			if len(run.woken) > 0 && run.after < end {
				t.Fatalf("pump at Redis time ≤%d granted %v before dead's lease ended at %d", run.after, run.woken, end)
			}
			if run.before >= end {
				pollsAfterEnd++
			}
			if len(run.woken) > 0 {
				grant = run
			}
		}
	}
	if !slices.Equal(grant.woken, []string{"w"}) {
		t.Fatalf("janitor granted %v, want [w] only: only dead's permit was free", grant.woken)
	}
	// Every pump sent after the lease ended must find the permit free, so
	// the first one grants it: the permit is back within lease + one poll.
	if pollsAfterEnd > 1 {
		t.Fatalf("w was granted by the %d-th pump after the lease ended, want the first", pollsAfterEnd)
	}
	took := grant.returned.Sub(lastRenew)
	t.Logf("permit back %v after the last renewal (lease %v, poll %v)", took.Round(time.Millisecond), lease, poll)
	if took > lease+2*poll {
		t.Fatalf("permit back %v after the last renewal, want within lease + 2 polls (%v)", took, lease+2*poll)
	}

	if ok, _ := g.Renew(ctx, "p", "dead"); ok {
		t.Fatal("the crashed holder renewed a permit that was given away")
	}
	if r := mustEnqueue(t, g, "w"); r.Status != Granted {
		t.Fatalf("w after the grant: %v", r.Status)
	}
	if pos, ok, _ := g.Position(ctx, "p", "w2"); !ok || pos != 1 {
		t.Fatalf("w2 at %d (queued %v), want still first in line: the live holder keeps its permit", pos, ok)
	}
	if st, _ := g.Stats(ctx, "p"); st.InUse != 2 || st.Waiting != 1 {
		t.Fatalf("stats %+v, want 2 in use and w2 waiting", st)
	}
}

// Waiters that die stop re-checking, so their liveness marks expire. Their
// entries are dropped as they reach the head, whoever moves the queue (a
// release handing its permit on, or the janitor reclaiming a crashed
// holder's), and the live waiters behind them are granted in order; when
// the queue is empty every tenant's count is back to zero.
func TestDeadWaitersAreClearedAndQueueKeepsMoving(t *testing.T) {
	for _, tc := range []struct {
		name string
		// holderCrashes: the holder never releases; its lease ends and the
		// janitor hands the permit on.
		holderCrashes bool
	}{{"release", false}, {"janitor", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const waiterTTL = time.Second
			g, rdb := newGate(t, 1, func(o *Options) {
				o.WaiterTTL = waiterTTL
				o.Lease = time.Second
			})
			ctx := context.Background()
			if r := mustEnqueueReq(t, g, Request{ID: "h-0", Tenant: "h", Weight: 1}); r.Status != Granted {
				t.Fatalf("holder: %v", r.Status)
			}
			// The holder streams (renews) until the dead waiters are dead.
			stopRenewing := renewEvery(t, g, "h-0", 100*time.Millisecond)
			// ghost's waiters all die, live's all live, and mixed's first
			// dies while its second lives behind it.
			arrivals := []string{"ghost-0", "mixed-0", "live-0", "ghost-1", "mixed-1", "live-1", "ghost-2", "live-2"}
			dead := map[string]bool{"ghost-0": true, "ghost-1": true, "ghost-2": true, "mixed-0": true}
			seqs := map[string]int64{}
			for _, id := range arrivals {
				r := mustEnqueueReq(t, g, Request{ID: id, Tenant: tenantOf(id), Weight: 1})
				if r.Status != Queued {
					t.Fatalf("%s: %v, want queued", id, r.Status)
				}
				seqs[id] = r.Seq
			}
			order, err := rdb.ZRange(ctx, g.keys("p").queue, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, id := range order {
				if !dead[id] {
					want = append(want, id)
				}
			}

			// Live waiters re-check as their workflows do (which renews
			// their marks); whatever a re-check grants is reported. The
			// reports may drop when the test is busy: a waiter granted a
			// permit reports it again with its next re-check.
			grants := make(chan string, 64)
			report := func(id string) {
				select {
				case grants <- id:
				default:
				}
			}
			rctx, stopRecheck := context.WithCancel(ctx)
			rechecking := make(chan struct{})
			defer func() {
				stopRecheck()
				<-rechecking
			}()
			go func() {
				defer close(rechecking)
				tick := time.NewTicker(waiterTTL / 20)
				defer tick.Stop()
				for {
					select {
					case <-rctx.Done():
						return
					case <-tick.C:
					}
					for _, id := range want {
						r, err := g.Enqueue(rctx, "p", Request{ID: id, Tenant: tenantOf(id), Weight: 1, Seq: seqs[id]})
						if rctx.Err() != nil {
							return
						}
						if err != nil {
							t.Errorf("re-check %s: %v", id, err)
							return
						}
						if r.Status == Granted {
							report(id)
						}
						for _, w := range IDs(r.Woken) {
							report(w)
						}
					}
				}
			}()

			// Wait for the dead waiters' marks to expire; their entries
			// stay, still counted, until they reach the head.
			waitFor(t, 10*time.Second, "dead waiters' liveness marks to expire", func() bool {
				for id := range dead {
					if n, err := rdb.Exists(ctx, g.keys("p").alivePrefix+id).Result(); err != nil || n != 0 {
						return false
					}
				}
				return true
			})
			assertDepth(t, g, map[string]int{"ghost": 3, "mixed": 2, "live": 3})

			var pending []string // granted by this goroutine's own releases
			if tc.holderCrashes {
				// Whoever pumps first after the lease ends hands the permit
				// on: the janitor, or a live waiter's re-check.
				stopRenewing()
				runs := startJanitor(t, g, rdb, 100*time.Millisecond)
				go func() {
					for {
						select {
						case run := <-runs:
							for _, w := range run.woken {
								report(w)
							}
						case <-rctx.Done():
							return
						}
					}
				}()
			} else {
				stopRenewing()
				rel, err := g.Release(ctx, "p", "h-0")
				if err != nil || !rel.HeldPermit {
					t.Fatalf("release holder: %+v %v", rel, err)
				}
				if len(rel.Woken) != 1 || IDs(rel.Woken)[0] != want[0] {
					t.Fatalf("release of the holder woke %v, want %s, the first live waiter, past the zombies", IDs(rel.Woken), want[0])
				}
				pending = IDs(rel.Woken)
			}

			// Serve: each granted waiter finishes at once and its release
			// hands the permit on, past the zombies.
			var got []string
			seen := map[string]bool{}
			deadline := time.After(15 * time.Second)
			for len(got) < len(want) {
				var id string
				if len(pending) > 0 {
					id, pending = pending[0], pending[1:]
				} else {
					select {
					case id = <-grants:
					case <-deadline:
						t.Fatalf("queue stuck: granted %v, want %v", got, want)
					}
				}
				if seen[id] {
					continue
				}
				seen[id] = true
				got = append(got, id)
				rel, err := g.Release(ctx, "p", id)
				if err != nil || !rel.HeldPermit {
					t.Fatalf("release %s: %+v %v", id, rel, err)
				}
				pending = append(pending, IDs(rel.Woken)...)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("granted %v, want the live waiters in queue order %v", got, want)
			}

			st, err := g.QueueStats(ctx, "p")
			if err != nil {
				t.Fatal(err)
			}
			if st.InUse != 0 || st.Waiting != 0 || len(st.ByTenant) != 0 {
				t.Fatalf("after the last live waiter: %+v, want an empty pool", st)
			}
			for _, tenant := range []string{"ghost", "mixed", "live"} {
				if _, n, err := g.Depth(ctx, "p", tenant); err != nil || n != 0 {
					t.Fatalf("tenant %s has %d waiting (%v), want 0", tenant, n, err)
				}
			}
			for id := range dead {
				if _, ok, _ := g.Position(ctx, "p", id); ok {
					t.Fatalf("zombie %s still queued", id)
				}
			}
			if ok, _ := g.Renew(ctx, "p", "h-0"); ok {
				t.Fatal("the first holder still holds a permit")
			}
			assertNoQueueState(t, rdb, g)
		})
	}
}

// waitFor polls cond until it holds; the timeout only turns a hang into a
// failure.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// KeepAlive stretches a waiter's place past WaiterTTL; the next Enqueue
// resets it; a request that is not queued is untouched.
func TestKeepAlive(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "holder")
	if r := mustEnqueue(t, g, "w"); r.Status != Queued {
		t.Fatalf("w: %+v", r)
	}
	key := g.keys("p").alivePrefix + "w"
	if err := g.KeepAlive(ctx, "p", "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl < 59*time.Second {
		t.Fatalf("liveness ttl %v after KeepAlive(1m)", ttl)
	}
	mustEnqueue(t, g, "w")
	if ttl := rdb.PTTL(ctx, key).Val(); ttl > 10*time.Second {
		t.Fatalf("liveness ttl %v after a re-check, want WaiterTTL", ttl)
	}
	if err := g.KeepAlive(ctx, "p", "never-queued", time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, g.keys("p").alivePrefix+"never-queued").Val(); n != 0 {
		t.Fatal("KeepAlive created a liveness key")
	}
}

// A waiter that will not re-check passes its remaining wait: its place
// lives that long instead of WaiterTTL.
func TestEnqueueAliveFor(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "holder")
	if r := mustEnqueueReq(t, g, Request{ID: "w", Tenant: "t", Weight: 1, AliveFor: 5 * time.Minute}); r.Status != Queued {
		t.Fatalf("w: %+v", r)
	}
	if ttl := rdb.PTTL(ctx, g.keys("p").alivePrefix+"w").Val(); ttl < 299*time.Second || ttl > 5*time.Minute {
		t.Fatalf("liveness ttl %v, want the 5m the waiter asked for", ttl)
	}
	if _, err := g.Enqueue(ctx, "p", Request{ID: "x", Tenant: "t", Weight: 1, AliveFor: -time.Second}); err == nil {
		t.Fatal("a negative AliveFor was accepted")
	}
}

type signals struct {
	mu  sync.Mutex
	ids []string
}

func (n *signals) NotifyGranted(_ context.Context, _, id string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ids = append(n.ids, id)
	return false, nil
}

// A fast waiter hears of its grant on the channel and gets no signal; a
// waiter that is not waiting fast (or stopped) gets the signal; a fast
// waiter whose grant was taken over but whose announcement it did not see
// still learns, from End, that the permit is its own.
func TestFastWaitersAndSignals(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	w, err := NewWaker(ctx, rdb, g)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	n := &signals{}

	a, err := w.Expect(ctx, "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := w.Expect(ctx, "b", time.Minute)
	if granted, err := b.End(ctx); err != nil || granted {
		t.Fatalf("b ended before any grant: granted %v, %v", granted, err)
	}
	if err := Wake(ctx, g, n, []Grant{{"p", "a"}, {"p", "b"}, {"p", "c"}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.C:
	case <-time.After(5 * time.Second):
		t.Fatal("a was not woken by the announcement")
	}
	if granted, _ := a.End(ctx); !granted {
		t.Fatal("a's End after its announcement says not granted")
	}
	n.mu.Lock()
	got := slices.Clone(n.ids)
	n.mu.Unlock()
	if !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("signalled %v, want [b c]", got)
	}

	// The announcement is lost (the waiter is deaf to it), yet End knows.
	d, _ := w.Expect(ctx, "d", time.Minute)
	d.forget()
	if err := Wake(ctx, g, n, []Grant{{"p", "d"}}); err != nil {
		t.Fatal(err)
	}
	if granted, err := d.End(ctx); err != nil || !granted {
		t.Fatalf("d: granted %v, %v; a releaser took it over", granted, err)
	}
}

// After Redis lost the queue (it restarted empty), waiters that come back
// with their restore tokens keep their order, and a newcomer queues behind
// them though the pool's virtual time started again at 0.
func TestRestoredWaitersStayAheadOfNewcomers(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueue(t, g, "holder")
	var seqs []int64
	for _, id := range []string{"w1", "w2", "w3"} {
		r := mustEnqueue(t, g, id)
		if r.Status != Queued {
			t.Fatalf("%s: %+v", id, r)
		}
		seqs = append(seqs, r.Seq)
	}
	// Redis restarts empty: every key of the pool is gone.
	keys, _ := rdb.Keys(ctx, g.prefix+"*").Result()
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, g, "holder2")              // someone holds the only permit again
	for i, id := range []string{"w2", "w1"} { // back in any order
		if r := mustEnqueueReq(t, g, Request{ID: id, Tenant: "t", Weight: 1, Seq: seqs[1-i]}); r.Status != Queued {
			t.Fatalf("%s restored: %+v", id, r)
		}
	}
	if r := mustEnqueueReq(t, g, Request{ID: "new", Tenant: "other", Weight: 1}); r.Status != Queued || r.Position != 3 {
		t.Fatalf("newcomer %+v: want position 3, behind the two restored waiters", r)
	}
	for want, id := range []string{"w1", "w2"} {
		if pos, ok, err := g.Position(ctx, "p", id); err != nil || !ok || pos != want+1 {
			t.Fatalf("%s at %d (%v %v), want %d", id, pos, ok, err, want+1)
		}
	}
}
