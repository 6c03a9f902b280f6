package admission

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// dl is a request of tenant with a deadline at ms past base and a TTFT SLO
// of slo (0: none, and no deadline).
type dl struct {
	id, tenant string
	weight     int
	cost       float64
	at, slo    time.Duration
}

var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (d dl) request(deadlines bool) Request {
	r := Request{ID: d.id, Tenant: d.tenant, Weight: d.weight, Cost: d.cost}
	if deadlines && d.slo > 0 {
		r.Deadline, r.SLO = base.Add(d.at+d.slo), d.slo
	}
	return r
}

// queueAll queues reqs in a one-permit pool held by "holder" (of its own
// tenant) and returns the gate; every request must queue.
func queueAll(t *testing.T, reqs []dl, deadlines bool) (*Gate, *redis.Client) {
	t.Helper()
	g, rdb := newGate(t, 1, func(o *Options) { o.MaxQueueDepth = 20000 })
	if r := mustEnqueueReq(t, g, Request{ID: "holder", Tenant: "h", Weight: 1}); r.Status != Granted {
		t.Fatalf("holder: %v", r.Status)
	}
	for _, d := range reqs {
		if r := mustEnqueueReq(t, g, d.request(deadlines)); r.Status != Queued {
			t.Fatalf("%s: %v, want queued", d.id, r.Status)
		}
	}
	return g, rdb
}

// tags is each queued request's tag.
func tags(t *testing.T, rdb *redis.Client, g *Gate) map[string]float64 {
	t.Helper()
	zs, err := rdb.ZRangeWithScores(context.Background(), g.keys("p").queue, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, z := range zs {
		out[z.Member.(string)] = z.Score
	}
	return out
}

// tenantTags is the set of tags tenant's requests hold, sorted.
func tenantTags(all map[string]float64, tenant string) []float64 {
	var out []float64
	for id, tag := range all {
		if tenantOf(id) == tenant {
			out = append(out, tag)
		}
	}
	slices.Sort(out)
	return out
}

// A tenant that queues two flex requests (no SLO) and then a priority one
// (1 s) has the priority one granted first, then the flex ones in the
// order they came; it holds the same tags as without deadlines, so its
// place among the other tenants is the same.
func TestTenantServedEarliestDeadlineFirst(t *testing.T) {
	reqs := []dl{
		{id: "a-flex1", tenant: "a", weight: 1, cost: 1},
		{id: "a-flex2", tenant: "a", weight: 1, cost: 1, at: time.Millisecond},
		{id: "a-prio", tenant: "a", weight: 5, cost: 1, at: 2 * time.Millisecond, slo: time.Second},
	}
	plain, prdb := queueAll(t, reqs, false)
	g, rdb := queueAll(t, reqs, true)
	was, now := tags(t, prdb, plain), tags(t, rdb, g)
	if !slices.Equal(tenantTags(was, "a"), tenantTags(now, "a")) {
		t.Fatalf("tenant a holds tags %v with deadlines, %v without: its place across tenants moved", tenantTags(now, "a"), tenantTags(was, "a"))
	}
	if now["a-prio"] != was["a-flex1"] || now["a-flex1"] != was["a-flex2"] || now["a-flex2"] != was["a-prio"] {
		t.Fatalf("tags with deadlines %v, want a-prio at a-flex1's %v and each flex one moved to the next tag", now, was)
	}
	_, granted := serve(t, g, "holder", 2)
	if rel, err := g.Release(context.Background(), "p", granted[1]); err != nil || len(rel.Woken) != 1 {
		t.Fatalf("release %s: %+v %v", granted[1], rel, err)
	} else {
		granted = append(granted, IDs(rel.Woken)...)
	}
	if want := []string{"a-prio", "a-flex1", "a-flex2"}; !slices.Equal(granted, want) {
		t.Fatalf("granted %v, want %v", granted, want)
	}
}

// servedInOrder queues reqs behind a holder and serves them all, returning
// the ids in grant order.
func servedInOrder(t *testing.T, reqs []dl, deadlines bool) []string {
	t.Helper()
	g, rdb := queueAll(t, reqs, deadlines)
	holder, granted := serve(t, g, "holder", len(reqs)-1)
	rel, err := g.Release(context.Background(), "p", holder)
	if err != nil || len(rel.Woken) != 1 {
		t.Fatalf("release %s: %+v %v", holder, rel, err)
	}
	granted = append(granted, IDs(rel.Woken)...)
	if _, err := g.Release(context.Background(), "p", granted[len(granted)-1]); err != nil {
		t.Fatal(err)
	}
	assertNoQueueState(t, rdb, g)
	return granted
}

// tenantsOf is the tenant of each id.
func tenantsOf(ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = tenantOf(id)
	}
	return out
}

// Two tenants of different weights and sizes, each mixing classes: with
// deadlines the grants go to the tenants in exactly the order they go
// without (the fair order across tenants is untouched), and within each
// tenant earliest deadline first, requests without one in arrival order
// behind.
func TestDeadlinesKeepTheOrderAcrossTenants(t *testing.T) {
	ms := time.Millisecond
	reqs := []dl{
		{id: "a-1", tenant: "a", weight: 1, cost: 1},
		{id: "b-1", tenant: "b", weight: 2, cost: 0.5, at: 1 * ms, slo: 2 * time.Second},
		{id: "a-2", tenant: "a", weight: 1, cost: 2, at: 2 * ms},
		{id: "b-2", tenant: "b", weight: 2, cost: 1, at: 3 * ms},
		{id: "a-3", tenant: "a", weight: 3, cost: 0.5, at: 4 * ms, slo: time.Second},
		{id: "b-3", tenant: "b", weight: 5, cost: 1, at: 5 * ms, slo: 500 * ms},
		{id: "a-4", tenant: "a", weight: 3, cost: 1, at: 6 * ms, slo: 3 * time.Second},
		{id: "b-4", tenant: "b", weight: 2, cost: 1, at: 7 * ms, slo: 2 * time.Second},
		{id: "a-5", tenant: "a", weight: 5, cost: 1, at: 8 * ms, slo: 500 * ms},
	}
	plain := servedInOrder(t, reqs, false)
	edf := servedInOrder(t, reqs, true)
	if !slices.Equal(tenantsOf(plain), tenantsOf(edf)) {
		t.Fatalf("tenants granted %v with deadlines, %v without", tenantsOf(edf), tenantsOf(plain))
	}
	var a, b []string
	for _, id := range edf {
		if tenantOf(id) == "a" {
			a = append(a, id)
		} else {
			b = append(b, id)
		}
	}
	// a: a-5 (508 ms), a-3 (1004), a-4 (3006), then a-1, a-2 (none).
	// b: b-3 (505), b-1 (2001), b-4 (2007), then b-2 (none).
	if want := []string{"a-5", "a-3", "a-4", "a-1", "a-2"}; !slices.Equal(a, want) {
		t.Errorf("tenant a granted %v, want %v", a, want)
	}
	if want := []string{"b-3", "b-1", "b-4", "b-2"}; !slices.Equal(b, want) {
		t.Errorf("tenant b granted %v, want %v", b, want)
	}
}

// Requests of one SLO keep the order they queued in even when their
// deadlines say otherwise (arrival times read on different doors' clocks):
// a tenant of one class is served exactly as without deadlines. Another
// class's request still goes where its deadline puts it.
func TestOneSLOKeepsQueueOrder(t *testing.T) {
	ms := time.Millisecond
	reqs := []dl{
		{id: "a-1", tenant: "a", weight: 1, cost: 1, at: 30 * ms, slo: time.Second},
		{id: "a-2", tenant: "a", weight: 1, cost: 1, at: 20 * ms, slo: time.Second},
		{id: "a-3", tenant: "a", weight: 1, cost: 1, at: 10 * ms, slo: time.Second},
	}
	if got, want := servedInOrder(t, reqs, true), servedInOrder(t, reqs, false); !slices.Equal(got, want) {
		t.Fatalf("one SLO: granted %v with deadlines, %v without", got, want)
	}
	reqs = append(reqs, dl{id: "a-4", tenant: "a", weight: 1, cost: 1, at: 40 * ms, slo: 500 * ms})
	if got, want := servedInOrder(t, reqs, true), []string{"a-4", "a-1", "a-2", "a-3"}; !slices.Equal(got, want) {
		t.Fatalf("granted %v, want the 500 ms request first, then the 1 s ones as they queued: %v", got, want)
	}
}

// Each request keeps its own charge whichever tag it holds: the priority
// request that took the flex one's tag is charged its own prompt, and
// releasing each with what it used leaves the tenant's credit as it is
// without deadlines: nothing is charged twice or to the wrong request.
func TestDealtTagsKeepEachRequestsCharge(t *testing.T) {
	reqs := []dl{
		{id: "a-flex", tenant: "a", weight: 1, cost: 4},
		{id: "a-prio", tenant: "a", weight: 5, cost: 0.5, at: time.Millisecond, slo: time.Second},
	}
	ctx := context.Background()
	credits := map[bool]string{}
	for _, deadlines := range []bool{false, true} {
		g, rdb := queueAll(t, reqs, deadlines)
		k := g.keys("p")
		for _, d := range reqs {
			v, err := rdb.HGet(ctx, k.charged, d.id).Result()
			if err != nil {
				t.Fatal(err)
			}
			if want := strconv.Itoa(int(d.cost*2520/float64(d.weight)+0.5)) + ":"; !strings.HasPrefix(v, want) {
				t.Fatalf("deadlines %v: %s charged %q, want its own %s...", deadlines, d.id, v, want)
			}
		}
		_, granted := serve(t, g, "holder", 1)
		rel, err := g.ReleaseUsed(ctx, "p", granted[0], 0.25)
		if err != nil || len(rel.Woken) != 1 {
			t.Fatalf("release %s: %+v %v", granted[0], rel, err)
		}
		// The tenant still holds a permit: its credit is kept to be read.
		c, err := rdb.HGet(ctx, k.credit, "a").Result()
		if err != nil {
			t.Fatalf("deadlines %v: credit of a after releasing %s: %v", deadlines, granted[0], err)
		}
		credits[deadlines] = granted[0] + " " + c
		if _, err := g.ReleaseUsed(ctx, "p", IDs(rel.Woken)[0], 0.25); err != nil {
			t.Fatal(err)
		}
		assertNoQueueState(t, rdb, g)
	}
	// Each used 0.25 of what it was charged: a-flex 4 at weight 1 (10080
	// ticks; 630 used), a-prio 0.5 at weight 5 (252; 126 used). Each
	// settles against its own charge, in whichever order it was served.
	if credits[false] != "a-flex 9450" || credits[true] != "a-prio 126" {
		t.Fatalf("credits after the first release %v, want a-flex 9450 without deadlines, a-prio 126 with", credits)
	}
}

// A deadline is dropped with its entry however the entry leaves: granted,
// cancelled (released while queued), shed, or dropped as a zombie.
func TestDeadlinesLeaveWithTheirEntries(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGate(t, 1, nil)
	k := g.keys("p")
	if r := mustEnqueueReq(t, g, Request{ID: "holder", Tenant: "h", Weight: 1}); r.Status != Granted {
		t.Fatalf("holder: %v", r.Status)
	}
	for i, d := range []dl{
		{id: "a-grant", tenant: "a", weight: 5, cost: 1, slo: time.Second},
		{id: "a-cancel", tenant: "a", weight: 5, cost: 1, at: time.Millisecond, slo: time.Second},
		{id: "b-zombie", tenant: "b", weight: 5, cost: 1, at: 2 * time.Millisecond, slo: time.Second},
		{id: "c-shed", tenant: "c", weight: 1, cost: 1, at: 3 * time.Millisecond, slo: 5 * time.Second},
	} {
		if r := mustEnqueueReq(t, g, d.request(true)); r.Status != Queued {
			t.Fatalf("%s: %v", d.id, r.Status)
		}
		if n := rdb.HLen(ctx, k.deadlines).Val(); n != int64(i+1) {
			t.Fatalf("after %s: %d deadlines, want %d", d.id, n, i+1)
		}
	}
	has := func(id string) bool { return rdb.HExists(ctx, k.deadlines, id).Val() }
	if rel, err := g.Release(ctx, "p", "a-cancel"); err != nil || !rel.WasQueued || has("a-cancel") {
		t.Fatalf("cancel: %+v %v, deadline kept %v", rel, err, has("a-cancel"))
	}
	if res, err := g.Shed(ctx, "p", ShedOptions{}); err != nil || !slices.Equal(res.IDs, []string{"c-shed"}) || has("c-shed") {
		t.Fatalf("shed: %+v %v, deadline kept %v", res, err, has("c-shed"))
	}
	if err := rdb.Del(ctx, k.alivePrefix+"b-zombie").Err(); err != nil {
		t.Fatal(err)
	}
	rel, err := g.Release(ctx, "p", "holder")
	if err != nil || !slices.Equal(IDs(rel.Woken), []string{"a-grant"}) || has("a-grant") {
		t.Fatalf("grant: %+v %v, deadline kept %v", rel, err, has("a-grant"))
	}
	// b-zombie is passed by when the permit comes back.
	if rel, err = g.Release(ctx, "p", "a-grant"); err != nil || len(rel.Woken) != 0 {
		t.Fatalf("release a-grant: %+v %v, want the zombie dropped", rel, err)
	}
	assertNoQueueState(t, rdb, g)
}

// In a group, a pool's entries are dealt by deadline in that pool, and a
// grant made from the other pool's release drops the deadline it grants
// (each pool's keys, KEYS[21…] for the other, are where lib.lua reads
// them).
func TestDeadlinesInAGroup(t *testing.T) {
	g := newGroup(t, 1, 1, 1)
	ctx := context.Background()
	if r := enqueueIn(t, g, "short", Request{ID: "s-hold", Tenant: "h"}); r.Status != Granted {
		t.Fatalf("s-hold: %v", r.Status)
	}
	for _, d := range []dl{
		{id: "a-flex", tenant: "a", weight: 1, cost: 1},
		{id: "a-prio", tenant: "a", weight: 5, cost: 1, at: time.Millisecond, slo: time.Second},
	} {
		if r := enqueueIn(t, g, "long", d.request(true)); r.Status != Queued {
			t.Fatalf("%s: %v", d.id, r.Status)
		}
	}
	long := g.keys("long")
	rdb := g.cmd
	if n := rdb.HLen(ctx, long.deadlines).Val(); n != 1 {
		t.Fatalf("long holds %d deadlines, want a-prio's", n)
	}
	rel := releaseIn(t, g, "short", "s-hold")
	if want := []Grant{{Pool: "long", ID: "a-prio"}}; !slices.Equal(rel.Woken, want) {
		t.Fatalf("release in short woke %v, want %v", rel.Woken, want)
	}
	if n := rdb.HLen(ctx, long.deadlines).Val(); n != 0 {
		t.Fatalf("long holds %d deadlines after granting a-prio, want 0", n)
	}
}

// A tenant with more entries queued than Lua can unpack at once (about
// 8,000), so its deadlines are read a thousand at a time, still has its
// priority request dealt the first of its places, and an entry without a
// deadline that comes after it queues at the end.
func TestDeadlinesAmongManyEntries(t *testing.T) {
	reqs := make([]dl, 0, 8202)
	for i := range 8200 {
		reqs = append(reqs, dl{id: fmt.Sprintf("a-%04d", i), tenant: "a", weight: 1, cost: 1, at: time.Duration(i) * time.Millisecond})
	}
	reqs = append(reqs,
		dl{id: "a-prio", tenant: "a", weight: 5, cost: 1, at: 2 * time.Second, slo: time.Second},
		dl{id: "a-last", tenant: "a", weight: 1, cost: 1, at: 3 * time.Second})
	g, rdb := queueAll(t, reqs, true)
	all := tags(t, rdb, g)
	if all["a-prio"] != tenantTags(all, "a")[0] || all["a-last"] != tenantTags(all, "a")[8201] {
		t.Fatalf("a-prio at %v, a-last at %v: want the first and the last of a's places", all["a-prio"], all["a-last"])
	}
	if _, granted := serve(t, g, "holder", 2); !slices.Equal(granted, []string{"a-prio", "a-0000"}) {
		t.Fatalf("granted %v, want a-prio, then a-0000", granted)
	}
}

// Priority requests that arrive among a tenant's flex ones all go ahead
// of them, in their own arrival order, whether the entry before a new one
// is flex (it is dealt in) or priority (it stays where it lands).
func TestDeadlinesInterleavedArrivals(t *testing.T) {
	ms := time.Millisecond
	reqs := []dl{
		{id: "a-flex1", tenant: "a", weight: 1, cost: 1},
		{id: "a-prio1", tenant: "a", weight: 5, cost: 1, at: ms, slo: time.Second},
		{id: "a-prio2", tenant: "a", weight: 5, cost: 1, at: 2 * ms, slo: time.Second},
		{id: "a-flex2", tenant: "a", weight: 1, cost: 1, at: 3 * ms},
		{id: "a-prio3", tenant: "a", weight: 5, cost: 1, at: 4 * ms, slo: time.Second},
		{id: "a-prio4", tenant: "a", weight: 5, cost: 1, at: 5 * ms, slo: time.Second},
	}
	got := servedInOrder(t, reqs, true)
	if want := []string{"a-prio1", "a-prio2", "a-prio3", "a-prio4", "a-flex1", "a-flex2"}; !slices.Equal(got, want) {
		t.Fatalf("granted %v, want %v", got, want)
	}
}
