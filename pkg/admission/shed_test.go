package admission

import (
	"context"
	"slices"
	"testing"
)

// queueTiers fills a one-permit pool: "holder" holds the permit, then
// free (weight 2), standard (3) and vip (5) requests wait.
func queueTiers(t *testing.T, g *Gate) {
	t.Helper()
	if r := mustEnqueueReq(t, g, Request{ID: "holder", Tenant: "h", Weight: 3}); r.Status != Granted {
		t.Fatalf("holder: %v", r.Status)
	}
	for _, req := range []Request{
		{ID: "free-1", Tenant: "f", Weight: 2},
		{ID: "std-1", Tenant: "s", Weight: 3},
		{ID: "free-2", Tenant: "f", Weight: 2},
		{ID: "vip-1", Tenant: "v", Weight: 5},
		{ID: "free-3", Tenant: "f2", Weight: 2},
	} {
		if r := mustEnqueueReq(t, g, req); r.Status != Queued {
			t.Fatalf("%s: %v, want queued", req.ID, r.Status)
		}
	}
}

func TestShedRemovesOnlyTheLowestWeight(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	queueTiers(t, g)

	res, err := g.Shed(ctx, "p", ShedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(res.IDs)
	if res.Weight != 2 || !slices.Equal(res.IDs, []string{"free-1", "free-2", "free-3"}) {
		t.Fatalf("shed %+v, want weight 2: free-1..3", res)
	}
	qs, err := g.QueueStats(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if qs.Waiting != 2 || qs.InUse != 1 || qs.ByTenant["f"] != 0 || qs.ByTenant["f2"] != 0 || qs.ByTenant["s"] != 1 {
		t.Fatalf("after shed %+v, want std-1 and vip-1 waiting and the holder's permit kept", qs)
	}
	// A shed request's re-check (or a retried enqueue) cannot queue it again.
	for _, id := range res.IDs {
		if r := mustEnqueueReq(t, g, Request{ID: id, Tenant: "f", Weight: 2}); r.Status != Shed {
			t.Fatalf("re-enqueue %s after shed: %v, want shed", id, r.Status)
		}
	}
	// Its workflow's release later keeps the tombstone saying "shed", and
	// frees nothing.
	rel, err := g.Release(ctx, "p", "free-1")
	if err != nil || rel.HeldPermit || rel.WasQueued || len(rel.Woken) != 0 {
		t.Fatalf("release of a shed request: %+v, %v", rel, err)
	}
	if r := mustEnqueueReq(t, g, Request{ID: "free-1", Tenant: "f", Weight: 2}); r.Status != Shed {
		t.Fatalf("re-enqueue after release: %v, want shed", r.Status)
	}
	// The survivors keep their places: vip (a fifth of a unit from V)
	// before standard (a third).
	if pos, ok, _ := g.Position(ctx, "p", "std-1"); !ok || pos != 2 {
		t.Fatalf("std-1 at %d %v, want 2", pos, ok)
	}
	// Now standard is the lowest of two weights: it goes next.
	res, err = g.Shed(ctx, "p", ShedOptions{})
	if err != nil || res.Weight != 3 || !slices.Equal(res.IDs, []string{"std-1"}) {
		t.Fatalf("second shed %+v, %v, want std-1", res, err)
	}
}

func TestShedNeverEmptiesASingleTier(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	mustEnqueueReq(t, g, Request{ID: "holder", Tenant: "h", Weight: 2})
	for _, id := range []string{"a", "b", "c"} {
		mustEnqueueReq(t, g, Request{ID: id, Tenant: "t-" + id, Weight: 2})
	}
	res, err := g.Shed(ctx, "p", ShedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Weight != 0 || len(res.IDs) != 0 {
		t.Fatalf("shed %+v with one weight waiting, want nothing", res)
	}
	if st, _ := g.Stats(ctx, "p"); st.Waiting != 3 {
		t.Fatalf("%d waiting, want 3", st.Waiting)
	}
	// An empty queue sheds nothing either.
	for _, id := range []string{"holder", "a", "b", "c"} {
		if _, err := g.Release(ctx, "p", id); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := g.Shed(ctx, "p", ShedOptions{}); err != nil || len(res.IDs) != 0 {
		t.Fatalf("shed of an empty queue: %+v, %v", res, err)
	}
	assertNoQueueState(t, rdb, g)
}

func TestShedCapTakesTheNewestFirst(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	queueTiers(t, g)
	res, err := g.Shed(ctx, "p", ShedOptions{Max: 2})
	if err != nil {
		t.Fatal(err)
	}
	// free-1 and free-2 share tenant f (tags 1/2 and 2/2 of a unit);
	// free-3's tenant f2 starts at V: its tag is free-1's. The newest in
	// virtual time are free-2, then free-1 or free-3.
	if res.Weight != 2 || len(res.IDs) != 2 || res.IDs[0] != "free-2" {
		t.Fatalf("capped shed %+v, want free-2 first and two in all", res)
	}
	if st, _ := g.Stats(ctx, "p"); st.Waiting != 3 {
		t.Fatalf("%d waiting after shedding 2 of 5, want 3", st.Waiting)
	}
	// Everything leaves: no bookkeeping (weights included) is left.
	for _, id := range []string{"holder", "free-1", "free-2", "free-3", "std-1", "vip-1"} {
		if _, err := g.Release(ctx, "p", id); err != nil {
			t.Fatal(err)
		}
	}
	assertNoQueueState(t, rdb, g)
	if _, err := g.Shed(ctx, "p", ShedOptions{Max: -1}); err == nil {
		t.Fatal("negative max accepted")
	}
	if _, err := g.Shed(ctx, "nope", ShedOptions{}); err == nil {
		t.Fatal("unknown pool accepted")
	}
}

func TestShedWithAKeyIsIdempotent(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	queueTiers(t, g)
	first, err := g.Shed(ctx, "p", ShedOptions{Key: "run-1/act-7"})
	if err != nil || first.Weight != 2 || len(first.IDs) != 3 {
		t.Fatalf("first shed %+v, %v", first, err)
	}
	// The retry answers the same and leaves standard alone.
	again, err := g.Shed(ctx, "p", ShedOptions{Key: "run-1/act-7"})
	if err != nil || again.Weight != 2 || !slices.Equal(again.IDs, first.IDs) {
		t.Fatalf("retried shed %+v, %v, want %+v", again, err, first)
	}
	if st, _ := g.Stats(ctx, "p"); st.Waiting != 2 {
		t.Fatalf("%d waiting after a retried shed, want 2", st.Waiting)
	}
	// Another key sheds the next lowest tier.
	next, err := g.Shed(ctx, "p", ShedOptions{Key: "run-1/act-9"})
	if err != nil || next.Weight != 3 || !slices.Equal(next.IDs, []string{"std-1"}) {
		t.Fatalf("next shed %+v, %v", next, err)
	}
	// Nothing-shed answers are remembered too.
	if r, err := g.Shed(ctx, "p", ShedOptions{Key: "run-1/act-11"}); err != nil || r.Weight != 0 || len(r.IDs) != 0 {
		t.Fatalf("shed of one tier %+v, %v", r, err)
	}
}
