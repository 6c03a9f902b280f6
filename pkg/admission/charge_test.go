package admission

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// payRun is one tenant of burstShares: it sends burst requests at once,
// each of prompt tokens asking maxTokens of output and using used.
type payRun struct {
	tenant                  string
	prompt, maxTokens, used int
}

// burstShares runs a pool of limit permits on the real scripts: every
// tenant sends its burst at once (interleaved), and each granted request
// streams one output token per tick of a simulated clock, charged every
// 10 ticks (as the keep-alive does) when payAsYouGo, and released with
// what it used. It returns each tenant's share of the output tokens of
// the first grants requests granted after the first limit. Not paying as
// it goes, each request is charged its bound up front (prompt and
// maxTokens), settled at release: the fair order before pay as you go.
func burstShares(t *testing.T, limit, grants, burst int, runs []payRun, payAsYouGo bool) map[string]float64 {
	t.Helper()
	g, _ := newGate(t, limit, nil)
	ctx := context.Background()
	of := map[string]payRun{}
	started := map[string]int{}
	served := map[string]int{}
	granted := 0
	clock := 0
	take := func(ids []string) {
		for _, id := range ids {
			started[id] = clock
			granted++
			if granted > limit && granted <= limit+grants {
				served[of[id].tenant] += of[id].used
			}
		}
	}
	for i := range burst {
		for _, r := range runs {
			id := fmt.Sprintf("%s-%03d", r.tenant, i)
			of[id] = r
			cost := TokenCost(r.prompt)
			if !payAsYouGo {
				cost = TokenCost(r.prompt + r.maxTokens)
			}
			res := mustEnqueueReq(t, g, Request{ID: id, Tenant: r.tenant, Weight: 1, Cost: cost})
			if res.Status == Granted {
				take([]string{id})
			}
		}
	}
	for granted < limit+grants {
		if len(started) == 0 {
			t.Fatal("nothing in flight while both tenants wait")
		}
		clock++
		for id, since := range started {
			r, out := of[id], clock-since
			if out >= r.used {
				delete(started, id)
				rel, err := g.ReleaseUsed(ctx, "p", id, TokenCost(r.prompt+r.used))
				if err != nil {
					t.Fatal(err)
				}
				take(IDs(rel.Woken))
			} else if payAsYouGo && out%10 == 0 {
				if _, err := g.Charge(ctx, "p", id, TokenCost(out)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	sum := 0
	for _, n := range served {
		sum += n
	}
	shares := map[string]float64{}
	for tenant, n := range served {
		shares[tenant] = float64(n) / float64(sum)
	}
	return shares
}

// Two tenants send a burst of the same requests (prompts of 100 tokens,
// answers of 100), one asking max_tokens 1024, the other exactly 100.
// Paying as they go, they are charged the same, the prompt at placement
// and each answer as it streams, and share the answers served equally.
// Charged their bounds up front (settled at release), the tenant that
// over-asks waits behind all of the other's burst: the comparison.
func TestPayAsYouGoSharesTheTokensServed(t *testing.T) {
	runs := []payRun{{"over", 100, 1024, 100}, {"exact", 100, 100, 100}}
	shares := burstShares(t, 4, 24, 30, runs, true)
	t.Logf("paying as they go: over %.1f%%, exact %.1f%%", 100*shares["over"], 100*shares["exact"])
	if math.Abs(shares["over"]-0.5) > 0.1 {
		t.Errorf("the tenant asking max_tokens 1024 got %.1f%% of the answers served, want 50%% ± 10", 100*shares["over"])
	}
	upFront := burstShares(t, 4, 24, 30, runs, false)
	t.Logf("charged the bound up front: over %.1f%%, exact %.1f%%", 100*upFront["over"], 100*upFront["exact"])
	if upFront["over"] > 0.3 {
		t.Errorf("charged its bounds up front, the tenant asking max_tokens 1024 got %.1f%%; the comparison is void", 100*upFront["over"])
	}
}

// A charge moves its tenant's F_t and every entry it has queued in the
// group's pools (queue score, order member and head) by the ticks
// charged, and the places it reserved at the door with them; another
// tenant's entries stay. A charge repeated, or for less output, charges
// nothing; only output beyond what was charged is.
func TestChargeMovesWaitingEntries(t *testing.T) {
	g := newGroup(t, 1, 1, 1)
	ctx := context.Background()
	rdb := g.cmd.(*redis.Client)
	enqueueIn(t, g, "short", Request{ID: "hold", Tenant: "z"})
	enqueueIn(t, g, "short", Request{ID: "a0", Tenant: "a", Cost: 1})
	releaseIn(t, g, "short", "hold") // a0 granted
	enqueueIn(t, g, "short", Request{ID: "a1", Tenant: "a", Cost: 1})
	enqueueIn(t, g, "long", Request{ID: "a2", Tenant: "a", Cost: 1})
	enqueueIn(t, g, "short", Request{ID: "b1", Tenant: "b", Cost: 1})
	place, _, err := g.Reserve(ctx, "long", "a", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	short, long := g.keys("short"), g.keys("long")
	before := map[string]int64{"a1": tagOf(t, rdb, short, "a1"), "a2": tagOf(t, rdb, long, "a2"), "b1": tagOf(t, rdb, short, "b1")}
	fBefore, _ := rdb.HGet(ctx, short.groupFinish, "a").Int64()
	aheadBefore, err := g.AheadOf(ctx, place)
	if err != nil {
		t.Fatal(err)
	}

	// Half a unit of output: 1260 ticks at weight 1.
	if n, err := g.Charge(ctx, "short", "a0", 0.5); err != nil || n != 1260 {
		t.Fatalf("charged %d (%v), want 1260 ticks", n, err)
	}
	for _, c := range []struct {
		k     poolKeys
		id    string
		moved int64
	}{{short, "a1", 1260}, {long, "a2", 1260}, {short, "b1", 0}} {
		got := tagOf(t, rdb, c.k, c.id)
		if got != before[c.id]+c.moved {
			t.Errorf("%s at %d, want %d", c.id, got, before[c.id]+c.moved)
		}
		tenant := c.id[:1]
		m := fmt.Sprintf("%d:%s:%017d:%s", len(tenant), tenant, got, c.id)
		if _, err := rdb.ZScore(ctx, c.k.order, m).Result(); err != nil {
			t.Errorf("%s's order member %q missing: %v", c.id, m, err)
		}
		if n, _ := rdb.ZCard(ctx, c.k.order).Result(); c.id == "a1" && n != 2 {
			t.Errorf("short's order holds %d members, want 2 (the moved one replaced)", n)
		}
	}
	if h, _ := rdb.ZScore(ctx, short.heads, "a").Result(); int64(h) != before["a1"]+1260 {
		t.Errorf("a's head in short at %v, want its moved first entry %d", h, before["a1"]+1260)
	}
	if f, _ := rdb.HGet(ctx, short.groupFinish, "a").Int64(); f != fBefore+1260 {
		t.Errorf("a's F_t %d, want %d", f, fBefore+1260)
	}
	if shifts, err := g.Shifts(ctx, "long"); err != nil || shifts["a"] != place.Shift+1260 || len(shifts) != 1 {
		t.Errorf("shifts %v (%v), want a's moved by 1260 from %d, in the group", shifts, err, place.Shift)
	}
	if ahead, _ := g.AheadOf(ctx, place); ahead != aheadBefore {
		t.Errorf("a's reserved place is behind %d, want %d: it moves with a's entries", ahead, aheadBefore)
	}

	for _, cost := range []float64{0.5, 0.25} {
		if n, err := g.Charge(ctx, "short", "a0", cost); err != nil || n != 0 {
			t.Fatalf("charging %v again charged %d (%v), want nothing", cost, n, err)
		}
	}
	if n, err := g.Charge(ctx, "short", "a0", 0.75); err != nil || n != 630 {
		t.Fatalf("charged %d (%v), want the 630 ticks beyond what was charged", n, err)
	}
	if n, err := g.Charge(ctx, "short", "b1", 1); err != nil || n != 0 {
		t.Fatalf("a request without a permit was charged %d (%v)", n, err)
	}
	// The reserved place is taken where it has moved to: behind a2.
	r := enqueueIn(t, g, "long", Request{ID: "a3", Tenant: "a", Cost: 1, Place: place})
	if want := place.Tag + 1890; r.Seq != want {
		t.Errorf("a3 took its place at %d, want %d (reserved at %d, moved 1890)", r.Seq, want, place.Tag)
	}
	if r.Seq <= tagOf(t, rdb, long, "a2") {
		t.Errorf("a3 at %d is not behind a2", r.Seq)
	}
}

// A stream charged part of its output settles only the rest at release:
// charged its prompt (a unit) and half a unit of output while it streamed,
// a request that used 1.8 units moves its tenant's entries 0.3 units more.
// One that used less than it was charged credits the difference.
func TestReleaseSettlesOnlyTheRemainder(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	k := g.keys("p")
	mustEnqueue(t, g, "h")
	for _, id := range []string{"a1", "a2", "a3"} {
		mustEnqueueReq(t, g, Request{ID: id, Tenant: "a", Weight: 1, Cost: 1})
	}
	mustRelease(t, g, "h") // a1 granted
	if n, err := g.Charge(ctx, "p", "a1", 0.5); err != nil || n != 1260 {
		t.Fatalf("charged %d (%v), want 1260", n, err)
	}
	a3 := tagOf(t, rdb, k, "a3")
	if _, err := g.ReleaseUsed(ctx, "p", "a1", 1.8); err != nil { // a2 granted
		t.Fatal(err)
	}
	if got := tagOf(t, rdb, k, "a3"); got != a3+756 {
		t.Fatalf("a3 at %d, want %d: moved by the 756 ticks not charged yet", got, a3+756)
	}
	if n, _ := rdb.Exists(ctx, k.credit).Result(); n != 0 {
		t.Fatal("a credit or debt was left for a settled request")
	}
	// a2 streamed half a unit, used 1.2 units in all: 0.3 units overcharged
	// (its prompt's bound was above its prompt).
	if _, err := g.Charge(ctx, "p", "a2", 0.5); err != nil {
		t.Fatal(err)
	}
	if _, err := g.ReleaseUsed(ctx, "p", "a2", 1.2); err != nil {
		t.Fatal(err)
	}
	if c, _ := rdb.HGet(ctx, k.credit, "a").Int(); c != 756 {
		t.Fatalf("credit %d, want 756 ticks", c)
	}
}

// Entries charged their bound up front, as the scripts before pay as you
// go charged them ("<ticks>:<weight>:<bound>", or "<ticks>:<weight>"
// before the bound was kept), are not charged while they stream (their
// charge covered the output already) and settle at release against what
// they were charged: the rolling deploy, old and new scripts on the same
// keys.
func TestUpFrontChargesSettle(t *testing.T) {
	for _, c := range []struct {
		old     string
		charged int64
	}{{"5040:1:5040", 5040}, {"2520:1", 2520}} {
		old := c.old
		t.Run(old, func(t *testing.T) {
			g, rdb := newGate(t, 1, nil)
			ctx := context.Background()
			k := g.keys("p")
			mustEnqueue(t, g, "h")
			mustEnqueueReq(t, g, Request{ID: "a1", Tenant: "a", Weight: 1, Cost: 1})
			mustEnqueueReq(t, g, Request{ID: "a2", Tenant: "a", Weight: 1, Cost: 1})
			mustEnqueueReq(t, g, Request{ID: "a3", Tenant: "a", Weight: 1, Cost: 1})
			mustRelease(t, g, "h") // a1 granted
			if err := rdb.HSet(ctx, k.charged, "a1", old).Err(); err != nil {
				t.Fatal(err)
			}
			a3 := tagOf(t, rdb, k, "a3")
			if n, err := g.Charge(ctx, "p", "a1", 3); err != nil || n != 0 {
				t.Fatalf("an entry charged up front was charged %d (%v) while streaming", n, err)
			}
			if v, _ := rdb.HGet(ctx, k.charged, "a1").Result(); v != old {
				t.Fatalf("its charge became %q, want %q kept", v, old)
			}
			charged := c.charged
			if _, err := g.ReleaseUsed(ctx, "p", "a1", 0.5); err != nil { // a2 granted
				t.Fatal(err)
			}
			if c, _ := rdb.HGet(ctx, k.credit, "a").Int64(); c != charged-1260 {
				t.Fatalf("credit %d, want %d: what it was charged beyond what it used", c, charged-1260)
			}
			if got := tagOf(t, rdb, k, "a3"); got != a3 {
				t.Fatalf("a3 moved from %d to %d", a3, got)
			}
		})
	}
}

func TestChargeChecksItsArguments(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	for _, cost := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, err := g.Charge(ctx, "p", "a", cost); err == nil {
			t.Errorf("cost %v accepted", cost)
		}
	}
	if _, err := g.Charge(ctx, "nope", "a", 1); err == nil {
		t.Error("an unknown pool accepted")
	}
}
