package admission

import (
	"fmt"
	"slices"
	"strings"
)

// Group is pools that share backends (config pools.shared): one fair
// queue in tokens across them, one virtual clock, one finish tag per
// tenant and one permit budget, so that a tenant's weighted share of the
// servers holds whichever pool its prompts route to. Each pool keeps its
// own queue, and its limit caps what it may hold of the budget: permits
// one pool leaves unused are lent to the other up to that cap, and what a
// pool's cap leaves of the budget is the other's reserve. lib.lua holds
// the rules.
type Group struct {
	// Pools are the pools' names; each belongs to at most one group.
	Pools []string
	// Limit is the budget: streams the shared backends run at once.
	Limit int
}

// group is a Group as the gate uses it.
type group struct {
	name  string // the hash tag: the pools' names, sorted, joined by "+"
	pools []string
	limit int
}

// Grant is one waiter given a permit by a call: the pool it was queued
// in, which may be another pool of the caller's group, and its id.
type Grant struct {
	Pool string
	ID   string
}

// IDs lists the request ids of grants.
func IDs(grants []Grant) []string {
	if len(grants) == 0 {
		return nil
	}
	out := make([]string, len(grants))
	for i, g := range grants {
		out[i] = g.ID
	}
	return out
}

// groups checks opts.Groups against opts.Limits and indexes them by pool.
func groups(opts Options) (map[string]*group, error) {
	out := map[string]*group{}
	for i, g := range opts.Groups {
		if len(g.Pools) < 2 {
			return nil, fmt.Errorf("admission: group %d must name at least two pools, got %v", i, g.Pools)
		}
		if g.Limit <= 0 {
			return nil, fmt.Errorf("admission: group %v limit must be > 0, got %d", g.Pools, g.Limit)
		}
		pools := slices.Sorted(slices.Values(g.Pools))
		gr := &group{name: strings.Join(pools, "+"), pools: pools, limit: g.Limit}
		for _, p := range pools {
			if _, ok := opts.Limits[p]; !ok {
				return nil, fmt.Errorf("admission: group %v names unknown pool %q", g.Pools, p)
			}
			if _, dup := out[p]; dup {
				return nil, fmt.Errorf("admission: pool %q is in two groups", p)
			}
			out[p] = gr
		}
	}
	return out, nil
}

// poolKeys are a pool's Redis keys (keys builds them).
type poolKeys struct {
	permits, grants, queue, stats, tenants, finish, waiters, since, weights string
	order, heads, held, parked, charged, deadlines, ranks                   string
	alivePrefix, tombPrefix                                                 string
	// epoch notes the Redis process serving the pool (epoch.go).
	epoch string
	// shedPrefix marks sheds already done, by key (Shed).
	shedPrefix string
	// clock, groupFinish and credit are the group's virtual time, finish
	// tags and tenants' credits: the pool's own stats and finish (and its
	// credit) for a pool alone (keys); reserved counts each tenant's
	// places reserved at the door (Reserve); shift is what each tenant's
	// streams were charged while it was busy, which moves its reserved
	// places (lib.lua advance).
	clock, groupFinish, credit, reserved, shift string
	// pausable and asked are the streams that may be paused and those
	// asked to pause (preempt.go).
	pausable, asked string
}

// list is KEYS of every script, in the order lib.lua names them.
func (k poolKeys) list() []string {
	return []string{
		k.permits, k.grants, k.queue, k.stats, k.tenants, k.finish, k.waiters, k.since, k.weights,
		k.order, k.heads, k.held, k.parked, k.charged, k.deadlines, k.ranks,
	}
}

// keys share the hash tag of the pool's group, so that the group's keys
// live in one Redis Cluster slot, as a multi-key script requires. A pool
// alone keeps the keys it always had ({pool}).
func (g *Gate) keys(pool string) poolKeys {
	tag, base := pool, ""
	if gr := g.groups[pool]; gr != nil {
		tag, base = gr.name, pool+":"
	}
	root := g.prefix + "adm:{" + tag + "}:"
	base = root + base
	k := poolKeys{
		permits: base + "permits", grants: base + "grants", queue: base + "queue", stats: base + "stats",
		tenants: base + "tenants", finish: base + "finish", waiters: base + "waiters", since: base + "since",
		weights: base + "weights", order: base + "order", heads: base + "heads", held: base + "held",
		parked: base + "parked", alivePrefix: base + "alive:", tombPrefix: base + "released:",
		charged: base + "charged", deadlines: base + "deadlines", ranks: base + "ranks", epoch: base + "epoch", shedPrefix: base + "shed:",
		clock: base + "stats", groupFinish: base + "finish", credit: base + "credit", reserved: base + "reserved",
		shift: base + "shift", pausable: base + "pausable", asked: base + "asked",
	}
	if g.groups[pool] != nil {
		k.clock, k.groupFinish, k.credit, k.reserved = root+"clock", root+"finish", root+"credit", root+"reserved"
		k.shift = root + "shift"
	}
	return k
}

// scriptKeys is KEYS of every script but renew: the pool's, its group's,
// then each other pool's of the group, as lib.lua reads them.
func (g *Gate) scriptKeys(pool string) []string {
	k := g.keys(pool)
	out := append(k.list(), k.clock, k.groupFinish, k.credit, k.reserved, k.shift)
	for _, o := range g.others(pool) {
		out = append(out, g.keys(o).list()...)
	}
	return out
}

// groupArgs is the ARGV tail lib.lua's group_args reads: the pool's name,
// the group limit (0 alone), then each other pool's name, limit and
// liveness prefix.
func (g *Gate) groupArgs(pool string) []any {
	gr := g.groups[pool]
	if gr == nil {
		return []any{pool, 0}
	}
	out := []any{pool, gr.limit}
	for _, o := range g.others(pool) {
		out = append(out, o, g.limits[o], g.keys(o).alivePrefix)
	}
	return out
}

// others are the pools sharing pool's group, in the group's order.
func (g *Gate) others(pool string) []string {
	gr := g.groups[pool]
	if gr == nil {
		return nil
	}
	out := make([]string, 0, len(gr.pools)-1)
	for _, p := range gr.pools {
		if p != pool {
			out = append(out, p)
		}
	}
	return out
}

// PermitsKey is the key of pool's permits: its Redis Cluster slot is the
// slot of all of pool's (and its group's) state, for tools and tests that
// must find the node serving it.
func (g *Gate) PermitsKey(pool string) string { return g.keys(pool).permits }

// GroupLimit is the budget pool shares with its group, 0 for a pool alone.
func (g *Gate) GroupLimit(pool string) int {
	if gr := g.groups[pool]; gr != nil {
		return gr.limit
	}
	return 0
}

// toGrants reads a flat pool, id, ... reply.
func toGrants(vs []any) []Grant {
	if len(vs) < 2 {
		return nil
	}
	out := make([]Grant, 0, len(vs)/2)
	for i := 0; i+1 < len(vs); i += 2 {
		p, _ := vs[i].(string)
		id, _ := vs[i+1].(string)
		out = append(out, Grant{Pool: p, ID: id})
	}
	return out
}

// withArgs is args followed by the group's.
func withArgs(args []any, group []any) []any { return append(args, group...) }

// SameGroup reports whether pools a and b share one fair order: the same
// pool, or pools of one group.
func (g *Gate) SameGroup(a, b string) bool {
	return a == b || g.groups[a] != nil && g.groups[a] == g.groups[b]
}
