package door

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// A request's expected wait in the pool's queue is its place in the fair
// order, not the queue's depth: a heavy tier's request joins ahead of a
// light tier's backlog. (The door judged every request by the depth, and
// turned away interactive requests at 2× load a few hundred milliseconds
// after they arrived; see the SLO bench.)
// The same place decides whether a request waits at the door while the
// pool's queue is full.
func TestQueueWaitIsThePlaceInTheFairOrder(t *testing.T) {
	rds, err := testenv.LaunchRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rds.Stop)
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	gate, err := admission.New(rdb, admission.Options{Lease: 10 * time.Second, WaiterTTL: time.Minute, MaxQueueDepth: 100,
		Limits: map[string]int{"short": 2, "long": 2}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	enqueue := func(id, tenant string) {
		t.Helper()
		if _, err := gate.Enqueue(ctx, "short", admission.Request{ID: id, Tenant: tenant, Weight: 1, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// Two permits held, one for 300 ms: the pool's mean hold.
	enqueue("h1", "hold")
	enqueue("h2", "hold")
	time.Sleep(300 * time.Millisecond)
	if _, err := gate.Release(ctx, "short", "h1"); err != nil {
		t.Fatal(err)
	}
	enqueue("h3", "hold")
	for i := range 8 {
		enqueue(fmt.Sprint("o", i), "other")
	}
	d := &Door{gate: gate, cfg: config.Default(), logger: slog.New(slog.DiscardHandler), returner: &holdings.Returner{Gate: gate}}
	at := func(tenant string, weight int) time.Duration {
		return d.queueWait(ctx, arrival{pool: "short", who: Caller{Tenant: tenant}, tier: policy.Tier{Weight: weight}, tokens: 1000, admitTokens: 1000})
	}
	st, err := gate.Stats(ctx, "short")
	if err != nil || st.MeanHold <= 0 {
		t.Fatalf("stats %+v (%v)", st, err)
	}
	// The queue (8 waiting) is past its bound (api.queue_per_permit 1 of
	// 2 permits): only a request the fair order puts within the bound
	// passes the waiting room.
	live := &policy.Policy{Pools: map[string]int{"short": 2}}
	passes := func(tenant string, weight int) bool {
		a := arrival{pool: "short", who: Caller{Tenant: tenant}, tier: policy.Tier{Weight: weight}, admitTokens: 1000}
		pass := d.reservePlace(ctx, &a, live, false)
		if a.place.Tag == 0 {
			t.Fatalf("no place reserved for %s", tenant)
		}
		d.giveBack(ctx, a.holdings())
		return pass
	}
	if !passes("vip", 5) || !passes("newcomer", 1) {
		t.Error("a weight-5 request, or a newcomer's, waits at the door though nothing queued is ahead of it")
	}
	if passes("other", 1) {
		t.Error("the backlogged tenant's next passed the door ahead of its own 8")
	}
	vip, other := at("vip", 5), at("other", 1)
	if want := admission.EstimateWait(1, 2, st.MeanHold); vip != want {
		t.Errorf("a weight-5 newcomer expects %s, want %s: nothing of the backlog is ahead of it", vip, want)
	}
	if want := admission.EstimateWait(9, 2, st.MeanHold); other != want {
		t.Errorf("the backlogged tenant's next expects %s, want %s: its own 8 are ahead", other, want)
	}
}
