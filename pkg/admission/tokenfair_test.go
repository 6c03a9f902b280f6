package admission

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"testing"
)

// sender is one backlogged tenant of the token-fairness runs: every
// request it sends is tokens long (prompt and max output).
type sender struct {
	tenant string
	weight int
	tokens int
}

// holder is a request holding a permit until end, on the simulated clock.
type holder struct {
	id  string
	end float64
}

type holders []holder

func (h holders) Len() int { return len(h) }
func (h holders) Less(i, j int) bool {
	return h[i].end < h[j].end || h[i].end == h[j].end && h[i].id < h[j].id
}
func (h holders) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *holders) Push(x any)   { *h = append(*h, x.(holder)) }
func (h *holders) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// tokenShares runs a pool of limit permits on the real scripts with every
// sender backlogged, on a simulated clock: each grant holds its permit for
// hold(tokens) and then releases it, which hands it to the next waiter.
// Senders top their backlog up after each grant. It returns each tenant's
// share of the tokens granted over grants grants, after a warm-up of the
// grants made before anyone queued. byCount sends every request at cost 1,
// as admission did before costs were passed.
func tokenShares(t *testing.T, limit, grants int, senders []sender, hold func(tokens int) float64, byCount bool) map[string]float64 {
	t.Helper()
	g, _ := newGate(t, limit, func(o *Options) { o.MaxQueueDepth = 100000 })
	ctx := context.Background()
	of := map[string]sender{}
	queued := map[string]int{}
	var clock float64
	var held holders
	granted := map[string]int{}
	total := 0
	take := func(id string, measure bool) {
		s := of[id]
		queued[s.tenant]--
		heap.Push(&held, holder{id: id, end: clock + hold(s.tokens)})
		if measure {
			granted[s.tenant] += s.tokens
			total++
		}
	}
	next := 0
	send := func(s sender) []string {
		id := fmt.Sprintf("%s-%07d", s.tenant, next)
		next++
		of[id] = s
		req := Request{ID: id, Tenant: s.tenant, Weight: s.weight}
		if !byCount {
			req.Cost = TokenCost(s.tokens)
		}
		r := mustEnqueueReq(t, g, req)
		queued[s.tenant]++
		if r.Status == Granted {
			return append(IDs(r.Woken), id)
		}
		return IDs(r.Woken)
	}
	// Keep every sender at least this many requests deep.
	const depth = 4
	topUp := func() []string {
		var woken []string
		for _, s := range senders {
			for queued[s.tenant] < depth {
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
		rel, err := g.Release(ctx, "p", h.id)
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

// Two backlogged tenants, one sending 8k-token prompts and one 100-token
// prompts (each with up to 512 tokens of answer), share the pool's tokens
// in proportion to their weights — 50/50 at equal weights, 75/25 at 3:1 —
// whether a permit is held for a time proportional to its tokens or for a
// fixed time. Counting requests instead, the long prompts took ~93%.
func TestTokenFairShares(t *testing.T) {
	const grants = 1200
	holds := map[string]func(int) float64{
		"hold ∝ tokens": func(tokens int) float64 { return float64(tokens) },
		"fixed hold":    func(int) float64 { return 1 },
	}
	for _, c := range []struct {
		name        string
		long, brief sender
		wantLong    float64
	}{
		{"equal weights", sender{"long", 3, 8000 + 512}, sender{"brief", 3, 100 + 512}, 0.50},
		{"weights 3:1", sender{"long", 3, 8000 + 512}, sender{"brief", 1, 100 + 512}, 0.75},
		{"weights 1:3", sender{"long", 1, 8000 + 512}, sender{"brief", 3, 100 + 512}, 0.25},
	} {
		for _, hn := range []string{"hold ∝ tokens", "fixed hold"} {
			t.Run(c.name+", "+hn, func(t *testing.T) {
				shares := tokenShares(t, 4, grants, []sender{c.long, c.brief}, holds[hn], false)
				t.Logf("token shares: long %.1f%%, brief %.1f%% (want %.0f/%.0f ± 5)",
					100*shares["long"], 100*shares["brief"], 100*c.wantLong, 100*(1-c.wantLong))
				if math.Abs(shares["long"]-c.wantLong) > 0.05 {
					t.Errorf("long prompts got %.1f%% of the tokens, want %.0f%% ± 5", 100*shares["long"], 100*c.wantLong)
				}
			})
		}
	}
	t.Run("by request count", func(t *testing.T) {
		shares := tokenShares(t, 4, grants, []sender{{"long", 3, 8000 + 512}, {"brief", 3, 100 + 512}}, holds["fixed hold"], true)
		t.Logf("token shares at cost 1 a request: long %.1f%%, brief %.1f%%", 100*shares["long"], 100*shares["brief"])
		if shares["long"] < 0.85 {
			t.Errorf("counting requests, long prompts got %.1f%% of the tokens; the comparison is void", 100*shares["long"])
		}
	})
}
