package admission

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
)

// grantAll fills a pool with granted requests, each of its own tenant.
func grantAll(t *testing.T, g *Gate, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if r := mustEnqueueReq(t, g, Request{ID: id, Tenant: "t-" + id, Weight: 1}); r.Status != Granted {
			t.Fatalf("%s: %v, want granted", id, r.Status)
		}
	}
}

func pausable(t *testing.T, g *Gate, id string, rank, pauses, tokens int) string {
	t.Helper()
	waiter, err := g.Pausable(context.Background(), "p", id, rank, pauses, tokens)
	if err != nil {
		t.Fatal(err)
	}
	return waiter
}

func preempt(t *testing.T, g *Gate, waiter string, rank int, rules PauseRules) string {
	t.Helper()
	victim, err := g.Preempt(context.Background(), "p", waiter, rank, rules)
	if err != nil {
		t.Fatal(err)
	}
	return victim
}

func TestPreemptPicksTheLeastUrgentLongestRunning(t *testing.T) {
	g, _ := newGate(t, 4, nil)
	grantAll(t, g, "def", "flex-old", "flex-new", "prio")
	rules := PauseRules{MinTokens: 10, MaxPauses: 2}
	pausable(t, g, "def", 1, 0, 100)
	pausable(t, g, "flex-old", 2, 0, 50)
	// "since" is Redis's clock in ms: the second flex stream starts later.
	time.Sleep(5 * time.Millisecond)
	pausable(t, g, "flex-new", 2, 0, 500)
	pausable(t, g, "prio", 0, 0, 500)
	if r := mustEnqueueReq(t, g, Request{ID: "w", Tenant: "urgent", Weight: 1}); r.Status != Queued {
		t.Fatalf("w: %v, want queued", r.Status)
	}
	if v := preempt(t, g, "w", 0, rules); v != "flex-old" {
		t.Fatalf("victim %q, want flex-old (least urgent, running longest)", v)
	}
	if v := preempt(t, g, "w", 0, rules); v != "flex-old" {
		t.Fatalf("asked again: victim %q, want flex-old again", v)
	}
	if w := pausable(t, g, "flex-old", 2, 0, 60); w != "w" {
		t.Fatalf("flex-old asked for %q, want w", w)
	}
	if w := pausable(t, g, "flex-new", 2, 0, 600); w != "" {
		t.Fatalf("flex-new asked for %q, want none", w)
	}
	// A restarted stream (its pause count moved) runs since now: the
	// other flex stream is now the one running longest.
	pausable(t, g, "flex-old", 2, 1, 60)
	if r := mustEnqueueReq(t, g, Request{ID: "w2", Tenant: "urgent2", Weight: 1}); r.Status != Queued {
		t.Fatalf("w2: %v, want queued", r.Status)
	}
	if v := preempt(t, g, "w2", 0, rules); v != "flex-new" {
		t.Fatalf("second waiter's victim %q, want flex-new", v)
	}
}

func TestPreemptNeverPausesWhatItMustNot(t *testing.T) {
	rules := PauseRules{MinTokens: 10, MaxPauses: 2}
	for _, tc := range []struct {
		name   string
		rank   int // the waiter's
		record func(t *testing.T, g *Gate)
	}{
		// A stream whose backend cannot continue never says it is pausable.
		{"not pausable", 0, func(*testing.T, *Gate) {}},
		{"within its first tokens", 0, func(t *testing.T, g *Gate) { pausable(t, g, "s", 2, 0, 9) }},
		{"paused enough", 0, func(t *testing.T, g *Gate) { pausable(t, g, "s", 2, 2, 100) }},
		{"as urgent as the waiter", 1, func(t *testing.T, g *Gate) { pausable(t, g, "s", 1, 0, 100) }},
		{"more urgent than the waiter", 1, func(t *testing.T, g *Gate) { pausable(t, g, "s", 0, 0, 100) }},
		{"priority for priority", 0, func(t *testing.T, g *Gate) { pausable(t, g, "s", 0, 0, 100) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, _ := newGate(t, 1, nil)
			grantAll(t, g, "s")
			tc.record(t, g)
			mustEnqueueReq(t, g, Request{ID: "w", Tenant: "urgent", Weight: 1})
			if v := preempt(t, g, "w", tc.rank, rules); v != "" {
				t.Fatalf("victim %q, want none", v)
			}
			if w := pausable(t, g, "s", 0, 0, 100); w != "" {
				t.Fatalf("s asked to pause for %q", w)
			}
		})
	}
}

func TestPreemptOnlyWhenFullAndTheTenantMayBeGranted(t *testing.T) {
	g, _ := newGate(t, 3, nil)
	grantAll(t, g, "s1", "s2")
	pausable(t, g, "s1", 2, 0, 100)
	pausable(t, g, "s2", 2, 0, 100)
	rules := PauseRules{MinTokens: 1, MaxPauses: 1}
	// Not queued: TestPreemptTellsAWaiterThatIsNotQueued.
	// A tenant at its cap (it holds one permit and may hold one) waits
	// without pausing anyone: a permit could not go to it.
	grantAll(t, g, "capped-1")
	mustEnqueueReq(t, g, Request{ID: "capped-2", Tenant: "t-capped-1", Weight: 1, MaxConcurrent: 1})
	if v := preempt(t, g, "capped-2", 0, rules); v != "" {
		t.Fatalf("victim %q for a tenant at its cap", v)
	}
	// Each of a tenant's waiters pauses one stream.
	mustEnqueueReq(t, g, Request{ID: "w1", Tenant: "urgent", Weight: 1})
	mustEnqueueReq(t, g, Request{ID: "w2", Tenant: "urgent", Weight: 1})
	v1, v2 := preempt(t, g, "w1", 0, rules), preempt(t, g, "w2", 0, rules)
	if v1 == "" || v2 == "" || v1 == v2 {
		t.Fatalf("victims %q and %q, want one stream each", v1, v2)
	}
	// The second's pause grants the tenant's first entry.
	y, err := g.Yield(context.Background(), "p", YieldRequest{ID: v2, Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !y.Paused || !slices.Equal(IDs(y.Woken), []string{"w1"}) {
		t.Fatalf("yield of %s: %+v, want the permit to w1, its tenant's first", v2, y)
	}
}

func TestYieldHandsThePermitToTheWaiterAndQueuesAtTheHead(t *testing.T) {
	g, rdb := newGate(t, 2, nil)
	ctx := context.Background()
	grantAll(t, g, "first", "other")
	// flex queues, so its entry is charged as it goes (one granted at
	// once is not).
	mustEnqueueReq(t, g, Request{ID: "flex", Tenant: "t-flex", Weight: 1, Cost: TokenCost(10)})
	if rel, err := g.Release(ctx, "p", "first"); err != nil || !slices.Equal(IDs(rel.Woken), []string{"flex"}) {
		t.Fatalf("release: %+v, %v, want flex granted", rel, err)
	}
	// A waiter that came first, and the urgent one behind it.
	mustEnqueueReq(t, g, Request{ID: "early", Tenant: "t-early", Weight: 1})
	mustEnqueueReq(t, g, Request{ID: "urgent", Tenant: "t-urgent", Weight: 1})
	pausable(t, g, "flex", 2, 0, 100)
	if n, err := g.Charge(ctx, "p", "flex", TokenCost(100)); err != nil || n <= 0 {
		t.Fatalf("charge: %d, %v", n, err)
	}
	charged := rdb.HGet(ctx, g.keys("p").charged, "flex").Val()
	if v := preempt(t, g, "urgent", 0, PauseRules{MinTokens: 10, MaxPauses: 1}); v != "flex" {
		t.Fatalf("victim %q, want flex", v)
	}
	y, err := g.Yield(ctx, "p", YieldRequest{ID: "flex", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !y.Paused || y.Seq <= 0 || !slices.Equal(IDs(y.Woken), []string{"urgent"}) {
		t.Fatalf("yield: %+v, want paused, the permit to urgent", y)
	}
	if got := rdb.HGet(ctx, g.keys("p").charged, "flex").Val(); got != charged {
		t.Fatalf("charged after the pause %q, want %q kept", got, charged)
	}
	if pos, queued, err := g.Position(ctx, "p", "flex"); err != nil || !queued || pos != 1 {
		t.Fatalf("flex at %d (queued %v, %v), want first in line", pos, queued, err)
	}
	rel, err := g.Release(ctx, "p", "other")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(IDs(rel.Woken), []string{"flex"}) {
		t.Fatalf("released permit went to %v, want the paused flex", IDs(rel.Woken))
	}
	if r := mustEnqueueReq(t, g, Request{ID: "flex", Tenant: "t-flex", Weight: 1}); r.Status != Granted {
		t.Fatalf("flex after its grant: %v, want granted", r.Status)
	}
	// Granted again, the stream is charged from where it was.
	if n, err := g.Charge(ctx, "p", "flex", TokenCost(150)); err != nil || n <= 0 {
		t.Fatalf("charge after the pause: %d, %v, want the 50 new tokens charged", n, err)
	}
	if y, err := g.Yield(ctx, "p", YieldRequest{ID: "gone", Weight: 1}); err != nil || y.Paused || y.Held {
		t.Fatalf("yield of a request holding nothing: %+v, %v", y, err)
	}
}

func TestYieldKeepsThePermitWhenNobodyTakesIt(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	grantAll(t, g, "flex")
	mustEnqueueReq(t, g, Request{ID: "urgent", Tenant: "t-urgent", Weight: 1})
	pausable(t, g, "flex", 2, 0, 100)
	if v := preempt(t, g, "urgent", 0, PauseRules{MinTokens: 10, MaxPauses: 1}); v != "flex" {
		t.Fatalf("victim %q, want flex", v)
	}
	// The waiter went away (its liveness mark lapsed) before the pause.
	rdb.Del(ctx, g.keys("p").alivePrefix+"urgent")
	y, err := g.Yield(ctx, "p", YieldRequest{ID: "flex", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !y.Held || y.Paused || len(y.Woken) != 0 {
		t.Fatalf("yield: %+v, want the permit back to flex", y)
	}
	if held, err := g.Renew(ctx, "p", "flex"); err != nil || !held {
		t.Fatalf("flex holds its permit: %v, %v", held, err)
	}
}

// The stream asked to pause hears it over the grant channel at once, not
// only at its next keep-alive round.
func TestPreemptAnnouncesThePause(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	w, err := NewWaker(ctx, rdb, g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	asked, stop := w.Listen(PauseTopic("flex"))
	defer stop()
	grantAll(t, g, "flex")
	pausable(t, g, "flex", 2, 0, 100)
	mustEnqueueReq(t, g, Request{ID: "urgent", Tenant: "t-urgent", Weight: 1})
	if v := preempt(t, g, "urgent", 0, PauseRules{MinTokens: 1, MaxPauses: 1}); v != "flex" {
		t.Fatalf("victim %q, want flex", v)
	}
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the pause was never announced")
	}
}

// A paused stream queues behind the waiters of more urgent classes, so
// the next permit to free goes to them rather than back to it (each would
// otherwise pause another stream), and still before a waiter of its own
// class that came after it. Its class's entries leave no rank behind.
func TestYieldQueuesBehindMoreUrgentWaiters(t *testing.T) {
	g, rdb := newGate(t, 2, nil)
	ctx := context.Background()
	grantAll(t, g, "first", "other")
	mustEnqueueReq(t, g, Request{ID: "flex", Tenant: "t-flex", Weight: 1, Cost: TokenCost(10), Class: request.ClassFlex})
	if rel, err := g.Release(ctx, "p", "first"); err != nil || !slices.Equal(IDs(rel.Woken), []string{"flex"}) {
		t.Fatalf("release: %+v, %v, want flex granted", rel, err)
	}
	mustEnqueueReq(t, g, Request{ID: "default", Tenant: "t-default", Weight: 1, Class: request.ClassDefault})
	mustEnqueueReq(t, g, Request{ID: "urgent", Tenant: "t-urgent", Weight: 1, Class: request.ClassPriority})
	pausable(t, g, "flex", 2, 0, 100)
	if v := preempt(t, g, "urgent", 0, PauseRules{MinTokens: 10, MaxPauses: 1}); v != "flex" {
		t.Fatalf("victim %q, want flex", v)
	}
	y, err := g.Yield(ctx, "p", YieldRequest{ID: "flex", Weight: 1, Class: request.ClassFlex})
	if err != nil {
		t.Fatal(err)
	}
	if !y.Paused || !slices.Equal(IDs(y.Woken), []string{"urgent"}) {
		t.Fatalf("yield: %+v, want paused, the permit to urgent", y)
	}
	if pos, queued, err := g.Position(ctx, "p", "flex"); err != nil || !queued || pos != 2 {
		t.Fatalf("flex at %d (queued %v, %v), want second, behind the default-class waiter", pos, queued, err)
	}
	mustEnqueueReq(t, g, Request{ID: "late-flex", Tenant: "t-late", Weight: 1, Class: request.ClassFlex})
	for _, step := range []struct{ release, want string }{
		{"other", "default"}, {"urgent", "flex"}, {"default", "late-flex"},
	} {
		rel, err := g.Release(ctx, "p", step.release)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(IDs(rel.Woken), []string{step.want}) {
			t.Fatalf("the permit %s gave back went to %v, want %s", step.release, IDs(rel.Woken), step.want)
		}
	}
	for _, id := range []string{"flex", "late-flex"} {
		if _, err := g.Release(ctx, "p", id); err != nil {
			t.Fatal(err)
		}
	}
	assertNoQueueState(t, rdb, g)
}

// In a group of pools sharing a budget, a waiter held back by the spent
// budget, not by its own pool's limit, pauses a stream of another pool of
// the group (the least urgent, longest running of them all) and is
// granted the permit the pause gives back to the budget; the paused
// stream queues behind the group's more urgent waiters, then is next. A waiter whose own pool is at its limit pauses only a
// stream of its own pool: another's permit would not be its.
func TestPreemptAcrossAGroupsPools(t *testing.T) {
	ctx := context.Background()
	rules := PauseRules{MinTokens: 10, MaxPauses: 2}
	offer := func(g *Gate, pool, id string) string {
		t.Helper()
		w, err := g.Pausable(ctx, pool, id, 2, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	start := func(g *Gate, pool, id string) {
		t.Helper()
		if r := enqueueIn(t, g, pool, Request{ID: id, Tenant: "t-" + id}); r.Status != Granted {
			t.Fatalf("%s: %v, want granted", id, r.Status)
		}
		offer(g, pool, id)
		// "since" is Redis's clock in ms: the next stream starts later.
		time.Sleep(5 * time.Millisecond)
	}
	ask := func(g *Gate, pool, waiter string) string {
		t.Helper()
		v, err := g.Preempt(ctx, pool, waiter, 1, rules)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	g := newGroup(t, 2, 2, 2)
	start(g, "long", "flex-long")
	start(g, "short", "flex-short")
	if r := enqueueIn(t, g, "short", Request{ID: "w", Tenant: "t-w"}); r.Status != Queued {
		t.Fatalf("w: %v, want queued: the budget is spent", r.Status)
	}
	for range 2 {
		if v := ask(g, "short", "w"); v != "flex-long" {
			t.Fatalf("victim %q, want flex-long: of the group's, running longest", v)
		}
	}
	if w := offer(g, "long", "flex-long"); w != "w" {
		t.Fatalf("flex-long asked for %q, want w", w)
	}
	// A more urgent waiter of the other pool, which the paused stream
	// queues behind: the budget would grant it next.
	enqueueIn(t, g, "short", Request{ID: "w2", Tenant: "t-w2", Class: request.ClassDefault})
	y, err := g.Yield(ctx, "long", YieldRequest{ID: "flex-long", Weight: 1, Class: request.ClassFlex})
	if err != nil {
		t.Fatal(err)
	}
	if !y.Paused || !slices.Equal(y.Woken, []Grant{{Pool: "short", ID: "w"}}) {
		t.Fatalf("yield: %+v, want paused and w granted in short", y)
	}
	if _, queued, err := g.Position(ctx, "long", "flex-long"); err != nil || !queued {
		t.Fatalf("flex-long queued %v (%v), want queued again", queued, err)
	}
	if rel := releaseIn(t, g, "short", "w"); !slices.Equal(rel.Woken, []Grant{{Pool: "short", ID: "w2"}}) {
		t.Fatalf("w's permit went to %+v, want w2, more urgent than the paused stream", rel.Woken)
	}
	if rel := releaseIn(t, g, "short", "flex-short"); !slices.Equal(rel.Woken, []Grant{{Pool: "long", ID: "flex-long"}}) {
		t.Fatalf("flex-short's permit went to %+v, want the paused flex-long", rel.Woken)
	}

	g = newGroup(t, 3, 1, 2)
	start(g, "long", "flex-long")
	start(g, "short", "flex-short")
	if r := enqueueIn(t, g, "short", Request{ID: "w", Tenant: "t-w"}); r.Status != Queued {
		t.Fatalf("w: %v, want queued: short is at its limit", r.Status)
	}
	if v := ask(g, "short", "w"); v != "flex-short" {
		t.Fatalf("victim %q, want flex-short: short's own limit holds w back", v)
	}
}
