package admission

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
)

// newGroup is a gate whose pools "short" and "long" share a budget of
// limit permits, short capped at shortCap and long at longCap.
func newGroup(t *testing.T, limit, shortCap, longCap int) *Gate {
	t.Helper()
	g, _ := newGate(t, 1, func(o *Options) {
		o.Limits = map[string]int{"short": shortCap, "long": longCap}
		o.Groups = []Group{{Pools: []string{"short", "long"}, Limit: limit}}
		o.MaxQueueDepth = 100000
	})
	return g
}

func enqueueIn(t *testing.T, g *Gate, pool string, req Request) Result {
	t.Helper()
	if req.Weight == 0 {
		req.Weight = 1
	}
	r, err := g.Enqueue(context.Background(), pool, req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func releaseIn(t *testing.T, g *Gate, pool, id string) Released {
	t.Helper()
	rel, err := g.Release(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// A pool borrows what the other leaves unused up to its own cap; the cap
// leaves the other its reserve, which it gets at once.
func TestGroupLendsUpToACap(t *testing.T) {
	g := newGroup(t, 4, 4, 3)
	for i := range 4 {
		r := enqueueIn(t, g, "long", Request{ID: fmt.Sprintf("l%d", i), Tenant: "a"})
		if want := Granted; i == 3 {
			if r.Status != Queued {
				t.Fatalf("l3: %v, want queued: long is capped at 3 of the 4", r.Status)
			}
		} else if r.Status != want {
			t.Fatalf("l%d: %v, want granted (borrowing short's unused permits)", i, r.Status)
		}
	}
	if r := enqueueIn(t, g, "short", Request{ID: "s0", Tenant: "b"}); r.Status != Granted {
		t.Fatalf("s0: %v, want granted from short's reserve", r.Status)
	}
	// The budget is spent: short is below its own cap of 4, yet waits.
	r := enqueueIn(t, g, "short", Request{ID: "s1", Tenant: "b"})
	if r.Status != Queued {
		t.Fatalf("s1: %v, want queued: the group's 4 permits are held", r.Status)
	}
	// s1 queued after l3 in the same virtual time: both are first of their
	// tenants, so the earlier tag (l3's, tenant a's first entry) counts
	// ahead of s1 across pools.
	if pos, ok, err := g.Position(context.Background(), "short", "s1"); err != nil || !ok || pos != 2 {
		t.Fatalf("s1 position %d %v %v, want 2 (l3 of the long pool ahead)", pos, ok, err)
	}
	// A long permit given back goes to the smallest tag of the pools below
	// their caps: long's own l3 (long now holds 2 of its 3).
	if rel := releaseIn(t, g, "long", "l0"); !slices.Equal(rel.Woken, []Grant{{"long", "l3"}}) {
		t.Fatalf("release l0 woke %v, want long/l3", rel.Woken)
	}
	// The next goes to s1, in the other pool: the wake names its pool.
	if rel := releaseIn(t, g, "long", "l1"); !slices.Equal(rel.Woken, []Grant{{"short", "s1"}}) {
		t.Fatalf("release l1 woke %v, want short/s1", rel.Woken)
	}
	st, err := g.Stats(context.Background(), "long")
	if err != nil || st.InUse != 2 {
		t.Fatalf("long in use %d (%v), want 2", st.InUse, err)
	}
}

// A newcomer to an idle pool queues when the other pool has a waiter that
// a free permit would go to: it comes first.
func TestGroupNewcomerQueuesBehindTheOtherPool(t *testing.T) {
	g := newGroup(t, 2, 2, 2)
	enqueueIn(t, g, "long", Request{ID: "l0", Tenant: "a"})
	enqueueIn(t, g, "long", Request{ID: "l1", Tenant: "a"})
	if r := enqueueIn(t, g, "long", Request{ID: "l2", Tenant: "a"}); r.Status != Queued {
		t.Fatalf("l2: %v, want queued", r.Status)
	}
	if r := enqueueIn(t, g, "short", Request{ID: "s0", Tenant: "b"}); r.Status != Queued {
		t.Fatalf("s0: %v, want queued behind the full budget", r.Status)
	}
	rel := releaseIn(t, g, "long", "l0")
	if !slices.Equal(rel.Woken, []Grant{{"long", "l2"}}) {
		t.Fatalf("release l0 woke %v, want long/l2, the earlier tag", rel.Woken)
	}
	if got := releaseIn(t, g, "long", "l1").Woken; !slices.Equal(got, []Grant{{"short", "s0"}}) {
		t.Fatalf("release l1 woke %v, want short/s0", got)
	}
	for _, c := range []struct{ pool, id string }{{"long", "l2"}, {"short", "s0"}} {
		releaseIn(t, g, c.pool, c.id)
	}
	if r := enqueueIn(t, g, "short", Request{ID: "s1", Tenant: "b"}); r.Status != Granted {
		t.Fatalf("s1 into an idle group: %v, want granted", r.Status)
	}
}

// A tenant's finish tag is the group's: splitting its requests across two
// pools gains it no second share, and its last entry leaving one pool does
// not forget the tag while it still waits in the other.
func TestGroupTenantHasOneFinishTag(t *testing.T) {
	g := newGroup(t, 1, 1, 1)
	enqueueIn(t, g, "short", Request{ID: "hold", Tenant: "z"})
	a1 := enqueueIn(t, g, "short", Request{ID: "a1", Tenant: "a", Cost: 1})
	a2 := enqueueIn(t, g, "long", Request{ID: "a2", Tenant: "a", Cost: 1})
	b1 := enqueueIn(t, g, "long", Request{ID: "b1", Tenant: "b", Cost: 1})
	if !(a1.Seq < a2.Seq) || a2.Seq <= b1.Seq {
		t.Fatalf("tags a1 %d, a2 %d, b1 %d: a's second entry must follow its first, behind b's first", a1.Seq, a2.Seq, b1.Seq)
	}
	if pos := b1.Position; pos != 2 {
		t.Fatalf("b1 at position %d, want 2 (behind a1 in the short pool)", pos)
	}
	if got := releaseIn(t, g, "short", "hold").Woken; !slices.Equal(got, []Grant{{"short", "a1"}}) {
		t.Fatalf("woke %v, want short/a1", got)
	}
	// a has no entry left in short but still waits in long: its tag stays,
	// so its next entry in short queues behind a2, not at V.
	a3 := enqueueIn(t, g, "short", Request{ID: "a3", Tenant: "a", Cost: 1})
	if a3.Seq <= a2.Seq {
		t.Fatalf("a3's tag %d is not past a2's %d: the tenant's tag was forgotten", a3.Seq, a2.Seq)
	}
}

// Two backlogged equal-weight tenants, one routed to the long pool with
// 8k-token prompts and one to the short pool with 100-token prompts, on
// backends they share: each gets half the tokens, although the long pool
// may hold only 12 of the 16 permits. Separate pools, as before groups,
// gave the short tenant its pool's tokens whatever the weights.
func TestGroupSharesTokensAcrossPools(t *testing.T) {
	long := sender{"long", 3, 8000 + 512}
	brief := sender{"brief", 3, 100 + 512}
	pools := map[string]string{"long": "long", "brief": "short"}
	// A permit is held for a time that grows with its tokens (prefill and
	// decode), or for one that does not (the answer's length, the same
	// for both, is what takes the time).
	holds := map[string]func(int) float64{
		"hold grows with tokens": func(tokens int) float64 { return 1 + float64(tokens)/2000 },
		"fixed hold":             func(int) float64 { return 1 },
	}
	for _, hn := range []string{"hold grows with tokens", "fixed hold"} {
		t.Run(hn, func(t *testing.T) {
			g := newGroup(t, 16, 16, 12)
			shares := groupShares(t, g, 3000, []sender{long, brief}, pools, holds[hn])
			t.Logf("token shares: long %.1f%%, brief %.1f%%", 100*shares["long"], 100*shares["brief"])
			if math.Abs(shares["long"]-0.5) > 0.05 {
				t.Errorf("the long pool's tenant got %.1f%% of the tokens, want 50%% ± 5", 100*shares["long"])
			}
			// The contrast: the same servers split 12/4 into pools apart
			// give whatever the split and the hold times make of it.
			apart, _ := newGate(t, 1, func(o *Options) {
				o.Limits = map[string]int{"short": 12, "long": 4}
				o.MaxQueueDepth = 100000
			})
			shares = groupShares(t, apart, 3000, []sender{long, brief}, pools, holds[hn])
			t.Logf("token shares apart: long %.1f%%, brief %.1f%%", 100*shares["long"], 100*shares["brief"])
			if math.Abs(shares["long"]-0.5) < 0.02 {
				t.Errorf("pools apart gave the long tenant %.1f%% too; the comparison is void", 100*shares["long"])
			}
		})
	}
}

// groupShares is tokenShares for a group: each sender's requests go to its
// pool, and a release may wake a waiter of either pool.
func groupShares(t *testing.T, g *Gate, grants int, senders []sender, poolOf map[string]string, hold func(int) float64) map[string]float64 {
	return servedShares(t, g, grants, senders, poolOf, hold, nil, true)
}

// servedShares is groupShares where a sender's request uses used(s)
// tokens of the s.tokens it is charged, settled at its release if settle;
// shares count the tokens used.
func servedShares(t *testing.T, g *Gate, grants int, senders []sender, poolOf map[string]string, hold func(int) float64, used func(sender) int, settle bool) map[string]float64 {
	if used == nil {
		used = func(s sender) int { return s.tokens }
	}
	t.Helper()
	ctx := context.Background()
	of := map[string]sender{}
	queued := map[string]int{}
	var clock float64
	var held holders
	granted := map[string]int{}
	total, next := 0, 0
	take := func(id string, measure bool) {
		s := of[id]
		queued[s.tenant]--
		heap.Push(&held, holder{id: id, end: clock + hold(used(s))})
		if measure {
			granted[s.tenant] += used(s)
			total++
		}
	}
	send := func(s sender) []string {
		id := fmt.Sprintf("%s-%07d", s.tenant, next)
		next++
		of[id] = s
		r := enqueueIn(t, g, poolOf[s.tenant], Request{ID: id, Tenant: s.tenant, Weight: s.weight, Cost: TokenCost(s.tokens)})
		queued[s.tenant]++
		if r.Status == Granted {
			return append(IDs(r.Woken), id)
		}
		return IDs(r.Woken)
	}
	topUp := func() []string {
		var woken []string
		for _, s := range senders {
			for queued[s.tenant] < 20 {
				woken = append(woken, send(s)...)
			}
		}
		return woken
	}
	for _, id := range topUp() {
		take(id, false)
	}
	for total < grants {
		if held.Len() == 0 {
			t.Fatal("no permit held while every sender is backlogged")
		}
		h := heap.Pop(&held).(holder)
		clock = h.end
		s := of[h.id]
		cost := 0.0
		if settle {
			cost = TokenCost(used(s))
		}
		rel, err := g.ReleaseUsed(ctx, poolOf[s.tenant], h.id, cost)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range IDs(rel.Woken) {
			take(id, true)
		}
		for _, id := range topUp() {
			take(id, true)
		}
	}
	sum := 0
	for _, n := range granted {
		sum += n
	}
	shares := map[string]float64{}
	for tenant, n := range granted {
		shares[tenant] = float64(n) / float64(sum)
	}
	return shares
}

func TestGroupOptionsAreChecked(t *testing.T) {
	limits := map[string]int{"short": 4, "long": 2}
	for _, c := range []struct {
		name   string
		groups []Group
	}{
		{"one pool", []Group{{Pools: []string{"short"}, Limit: 4}}},
		{"no limit", []Group{{Pools: []string{"short", "long"}}}},
		{"unknown pool", []Group{{Pools: []string{"short", "huge"}, Limit: 4}}},
		{"pool twice", []Group{{Pools: []string{"short", "long"}, Limit: 4}, {Pools: []string{"long", "short"}, Limit: 4}}},
	} {
		if _, err := groups(Options{Limits: limits, Groups: c.groups}); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

// Requests are charged their bound (prompt bound and max output tokens)
// and use less, one tenant far less than the other: settled at release,
// the tenants share the tokens used, not the bounds. Unsettled, the one
// whose bounds overstate more got that much less.
func TestSettledCostsShareTheTokensUsed(t *testing.T) {
	loose := sender{"loose", 1, 4000} // uses a quarter of its bound
	tight := sender{"tight", 1, 1000} // uses all of it
	use := func(s sender) int {
		if s.tenant == "loose" {
			return s.tokens / 4
		}
		return s.tokens
	}
	pools := map[string]string{"loose": "long", "tight": "short"}
	hold := func(tokens int) float64 { return 1 + float64(tokens)/1000 }
	g := newGroup(t, 8, 8, 8)
	shares := servedShares(t, g, 3000, []sender{loose, tight}, pools, hold, use, true)
	t.Logf("settled: loose %.1f%%, tight %.1f%% of the tokens used", 100*shares["loose"], 100*shares["tight"])
	if math.Abs(shares["loose"]-0.5) > 0.05 {
		t.Errorf("settled, the tenant whose bounds overstate got %.1f%% of the tokens used, want 50%% ± 5", 100*shares["loose"])
	}
	// Unsettled (cost unknown at release): shares of the bounds.
	g = newGroup(t, 8, 8, 8)
	shares = servedShares(t, g, 3000, []sender{loose, tight}, pools, hold, use, false)
	t.Logf("unsettled: loose %.1f%%, tight %.1f%%", 100*shares["loose"], 100*shares["tight"])
	if shares["loose"] > 0.35 {
		t.Errorf("unsettled, the loose tenant got %.1f%%; the comparison is void", 100*shares["loose"])
	}
}

// A settled request credits its tenant once, with its permit, what it
// was charged beyond what it used; the credit shortens the tenant's next
// entry. What it used beyond its charge is charged at release as its
// stream's tokens are (Charge): the tenant's waiting entries move later.
// The tenant keeps its F_t while it has requests in flight, and when it
// goes idle keeps as a debt what its charges ran F_t ahead of V, which
// its next entry pays.
func TestSettlementIsOnceAndNotBanked(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	k := g.keys("p")
	mustEnqueue(t, g, "h")
	for _, id := range []string{"a1", "a2"} {
		mustEnqueueReq(t, g, Request{ID: id, Tenant: "a", Weight: 1, Cost: 2})
	}
	mustRelease(t, g, "h") // a1 granted
	a3 := mustEnqueueReq(t, g, Request{ID: "a3", Tenant: "a", Weight: 1, Cost: 2})
	for range 2 { // a2 granted; the second release finds nothing to settle
		if _, err := g.ReleaseUsed(ctx, "p", "a1", 0.5); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := rdb.HGet(ctx, k.credit, "a").Int(); err != nil || c != (2-0.5)*2520 {
		t.Fatalf("credit %d (%v), want 1.5 units (3780 ticks), once", c, err)
	}
	// a's next entry is charged its 2 units, 5040 ticks, less the credit.
	a4 := mustEnqueueReq(t, g, Request{ID: "a4", Tenant: "a", Weight: 1, Cost: 2})
	if got := a4.Seq - a3.Seq; got != 5040-3780 {
		t.Fatalf("a4 is %d ticks past a3, want 1260: its charge less the credit", got)
	}
	if n, _ := rdb.Exists(ctx, k.credit).Result(); n != 0 {
		t.Fatal("the credit was not used up")
	}
	// a2 used a unit more than it was charged: a3 and a4 wait a unit
	// later, and no debt is left.
	if _, err := g.ReleaseUsed(ctx, "p", "a2", 3); err != nil { // a3 granted
		t.Fatal(err)
	}
	if got := tagOf(t, rdb, k, "a4"); got != a4.Seq+2520 {
		t.Fatalf("a4 at %d, want %d: a unit later", got, a4.Seq+2520)
	}
	if n, _ := rdb.Exists(ctx, k.credit).Result(); n != 0 {
		t.Fatal("a debt was kept for what was charged")
	}
	// a's last entry leaves the queue: its F_t stays while a3 is in
	// flight.
	mustRelease(t, g, "a4")
	if n, _ := rdb.HExists(ctx, k.finish, "a").Result(); !n {
		t.Fatal("a tenant with a request in flight lost its F_t")
	}
	// a goes idle: V is a3's tag, a's F_t a4's (1260 ticks on), which
	// its charge of a unit ran ahead: 1260 ticks stay a debt.
	mustRelease(t, g, "a3")
	if c, _ := rdb.HGet(ctx, k.credit, "a").Int(); c != -1260 {
		t.Fatalf("credit %d after a went idle, want a debt of 1260 ticks", c)
	}
	if n, _ := rdb.Exists(ctx, k.finish, k.shift).Result(); n != 0 {
		t.Fatal("an idle tenant kept its F_t or shift")
	}
	// Back from idle, a's next entry starts at V and is longer by the
	// debt.
	mustEnqueue(t, g, "h2")
	v := vtimeOf(t, rdb, g)
	a5 := mustEnqueueReq(t, g, Request{ID: "a5", Tenant: "a", Weight: 1, Cost: 2})
	if got := a5.Seq - v; got != 5040+1260 {
		t.Fatalf("a5 is %d ticks past V, want 6300: its charge and the debt", got)
	}
	mustRelease(t, g, "a5")
	mustRelease(t, g, "h2")
	assertNoQueueState(t, rdb, g)
}

// tagOf is queued request id's tag.
func tagOf(t *testing.T, rdb *redis.Client, k poolKeys, id string) int64 {
	t.Helper()
	s, err := rdb.ZScore(context.Background(), k.queue, id).Result()
	if err != nil {
		t.Fatalf("tag of %s: %v", id, err)
	}
	return int64(s)
}

// Ahead counts the entries a new request would wait behind: a heavy
// tier's request is ahead of a light tier's backlog, a light one behind
// it, and entries of the group's other pool count.
func TestAheadCountsTheFairOrder(t *testing.T) {
	g := newGroup(t, 1, 1, 1)
	ctx := context.Background()
	enqueueIn(t, g, "short", Request{ID: "hold", Tenant: "z"})
	for i := range 6 {
		pool := []string{"short", "long"}[i%2]
		enqueueIn(t, g, pool, Request{ID: fmt.Sprintf("b%d", i), Tenant: "batch", Weight: 1, Cost: 1})
	}
	heavy, err := g.Ahead(ctx, "short", "vip", 5, 1)
	if err != nil || heavy != 0 {
		t.Fatalf("a weight-5 newcomer is behind %d (%v), want 0: its tag is before the backlog's first", heavy, err)
	}
	light, err := g.Ahead(ctx, "long", "batch", 1, 1)
	if err != nil || light != 6 {
		t.Fatalf("the batch tenant's next is behind %d (%v), want all 6 of its own, in both pools", light, err)
	}
}

// vtimeOf is the virtual time V of the gate's pool "p".
func vtimeOf(t *testing.T, rdb *redis.Client, g *Gate) int64 {
	t.Helper()
	v, err := rdb.HGet(context.Background(), g.keys("p").clock, "vtime").Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return v
}
