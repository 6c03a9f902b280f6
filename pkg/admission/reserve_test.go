package admission

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
)

// grantOrder releases held until the queue is empty and returns the ids in
// the order they were granted.
func grantOrder(t *testing.T, g *Gate, held string) []string {
	t.Helper()
	var order []string
	for held != "" {
		rel := mustRelease(t, g, held)
		held = ""
		if ids := IDs(rel.Woken); len(ids) > 0 {
			order = append(order, ids...)
			held = ids[0]
		}
	}
	return order
}

// A tenant whose requests wait at the door keeps its place in the fair
// order while they wait: its next request is placed after them, and a
// tenant that asked nothing goes ahead of them, as in one queue. Without
// places, each of the heavy tenant's requests would reach the queue as if
// it had asked for nothing, and the light one would wait behind them.
func TestPlacesReservedAtTheDoorKeepOneOrder(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueueReq(t, g, Request{ID: "hold", Tenant: "x", Weight: 1})
	// Heavy's first request queues; three more wait at the door.
	mustEnqueueReq(t, g, Request{ID: "h0", Tenant: "heavy", Weight: 1})
	var places []request.Place
	for range 3 {
		p, _, err := g.Reserve(ctx, "p", "heavy", 1, 1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		places = append(places, p)
	}
	// Light arrives at the door after them, ahead of all but heavy's first.
	light, ahead, err := g.Reserve(ctx, "p", "light", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ahead != 1 || light.Tag >= places[1].Tag {
		t.Fatalf("light's place %d with %d ahead; want before heavy's second place %d, behind h0 alone", light.Tag, ahead, places[1].Tag)
	}
	if n, err := g.AheadOf(ctx, light); err != nil || n != 1 {
		t.Fatalf("AheadOf(light) = %d (%v), want 1", n, err)
	}
	// They reach the queue in the door's order, heavy's first.
	for i, p := range places {
		mustEnqueueReq(t, g, Request{ID: "h" + string(rune('1'+i)), Tenant: "heavy", Weight: 1, Place: p})
	}
	mustEnqueueReq(t, g, Request{ID: "l0", Tenant: "light", Weight: 1, Place: light})
	if got, want := grantOrder(t, g, "hold"), []string{"h0", "l0", "h1", "h2", "h3"}; !slices.Equal(got, want) {
		t.Fatalf("granted %v, want %v", got, want)
	}
}

// Between its queue entries, a tenant with places at the door keeps its
// F_t: its next place follows the ones it holds, not V.
func TestPlacesKeepTheTenantsFinishTag(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueueReq(t, g, Request{ID: "hold", Tenant: "x", Weight: 1})
	mustEnqueueReq(t, g, Request{ID: "h0", Tenant: "heavy", Weight: 1})
	p1, _, err := g.Reserve(ctx, "p", "heavy", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// h0 is granted: heavy has no entry queued, but a place at the door.
	mustRelease(t, g, "hold")
	p2, _, err := g.Reserve(ctx, "p", "heavy", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Tag <= p1.Tag {
		t.Fatalf("heavy's next place %d is not after its place at the door %d", p2.Tag, p1.Tag)
	}
}

// A place given back (its request ended at the door) is not charged: the
// tenant's next place starts where the given-back one did; a tenant left
// with nothing forgets its F_t. A place never given back lapses.
func TestUnreserveAndLapse(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueueReq(t, g, Request{ID: "hold", Tenant: "x", Weight: 1})
	mustEnqueueReq(t, g, Request{ID: "o0", Tenant: "other", Weight: 1})
	a, _, err := g.Reserve(ctx, "p", "t", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := g.Reserve(ctx, "p", "t", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Unreserve(ctx, b); err != nil {
		t.Fatal(err)
	}
	c, _, err := g.Reserve(ctx, "p", "t", 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tag != b.Tag {
		t.Fatalf("after giving back %d the next place is %d, want the same", b.Tag, c.Tag)
	}
	for _, p := range []request.Place{a, c} {
		if err := g.Unreserve(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	d, _, err := g.Reserve(ctx, "p", "t", 1, 1, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if d.Tag != a.Tag {
		t.Fatalf("an idle tenant's place is %d, want %d: from V again", d.Tag, a.Tag)
	}
	// d is never given back: after its ttl the tenant has no place left,
	// and its F_t goes with its last queue entry, as before places.
	time.Sleep(100 * time.Millisecond)
	mustEnqueueReq(t, g, Request{ID: "t0", Tenant: "t", Weight: 1})
	if _, err := g.Release(ctx, "p", "t0"); err != nil {
		t.Fatal(err)
	}
	if ok, err := rdb.HExists(ctx, g.keys("p").groupFinish, "t").Result(); err != nil || ok {
		t.Fatalf("F_t of a tenant with a lapsed place and no entry kept: %v (%v)", ok, err)
	}
}
