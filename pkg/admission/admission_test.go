package admission

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var redisAddr string

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { redisAddr = r.Addr }))
}

func newGate(t *testing.T, limit int, mod func(*Options)) (*Gate, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := Options{
		KeyPrefix:     "t:" + t.Name() + ":",
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

func mustEnqueue(t *testing.T, g *Gate, id string) Result {
	t.Helper()
	r, err := g.Enqueue(context.Background(), "p", id, 0)
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
	if !rel.HeldPermit || len(rel.Woken) != 1 || rel.Woken[0] != "c" {
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
	if r.Status != Queued || r.Position != 1 || len(r.Woken) != 1 || r.Woken[0] != "b" {
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
	if len(woken) != 1 || woken[0] != "w" {
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
	if len(rel.Woken) != 1 || rel.Woken[0] != "live" {
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
	rdb.ZRem(ctx, g.keys("p").queue, "x")
	r, err := g.Enqueue(ctx, "p", "x", first.Seq)
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
		r, err := g.Enqueue(ctx, "p", "w", seq)
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
	if len(woken) != 1 || woken[0] != "b" {
		t.Fatalf("after raising limit woke %v", woken)
	}
	if r := mustEnqueue(t, g, "c"); r.Status != Granted || r.Limit != 3 {
		t.Fatalf("c = %+v", r)
	}
	if err := g.SetLimit(ctx, "p", 0); err == nil {
		t.Fatal("limit 0 accepted")
	}
	if _, err := g.Enqueue(ctx, "nope", "x", 0); err == nil {
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

// Many concurrent requests through a gate of 3: never more than 3 hold a
// permit, everyone is served, and every permit and entry is returned.
func TestConcurrentNeverExceedsLimit(t *testing.T) {
	const limit, n = 3, 60
	g, _ := newGate(t, limit, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

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
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := g.Enqueue(ctx, "p", id, 0)
			if err != nil {
				t.Error(err)
				return
			}
			notify(r.Woken)
			for r.Status != Granted {
				select {
				case <-wake[id]:
					r.Status = Granted
				case <-time.After(200 * time.Millisecond):
					// Fallback re-check, as a workflow does on its timer.
					if r, err = g.Enqueue(ctx, "p", id, r.Seq); err != nil {
						t.Error(err)
						return
					}
					notify(r.Woken)
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
			notify(rel.Woken)
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
}

// BenchmarkGrantRelease is one request's admission round trip on a free
// pool: grant at once, then release.
func BenchmarkGrantRelease(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g, err := New(rdb, Options{KeyPrefix: "bench:", Lease: 30 * time.Second, WaiterTTL: 30 * time.Second, MaxQueueDepth: 1000, Limits: map[string]int{"p": 1 << 20}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprint("r", i)
		if _, err := g.Enqueue(ctx, "p", id, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := g.Release(ctx, "p", id); err != nil {
			b.Fatal(err)
		}
	}
}
