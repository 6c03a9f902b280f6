package admission

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// failingNotifier refuses every notification.
type failingNotifier struct{}

func (failingNotifier) NotifyGranted(context.Context, string, string) (bool, error) {
	return false, errors.New("temporal unreachable")
}

// ReleaseAndWake hands the released permit to the next waiter and wakes
// it; released again, it frees nothing. A wake-up that fails leaves the
// permit granted and says so with ErrNotWoken.
func TestReleaseAndWake(t *testing.T) {
	ctx := context.Background()
	g, _ := newGate(t, 1, nil)
	mustEnqueue(t, g, "a")
	if r := mustEnqueue(t, g, "b"); r.Status != Queued {
		t.Fatalf("b: %v, want queued", r.Status)
	}
	n := &signals{}
	rel, err := g.ReleaseAndWake(ctx, n, "p", "a")
	if err != nil {
		t.Fatal(err)
	}
	if !rel.HeldPermit || !slices.Equal(IDs(rel.Woken), []string{"b"}) || !slices.Equal(n.ids, []string{"b"}) {
		t.Fatalf("released %+v, signalled %v: want a's permit handed to b, b woken", rel, n.ids)
	}
	if rel, err := g.ReleaseAndWake(ctx, n, "p", "a"); err != nil || rel.HeldPermit || len(rel.Woken) > 0 {
		t.Fatalf("second release: %+v, %v; want nothing freed", rel, err)
	}
	if r := mustEnqueue(t, g, "c"); r.Status != Queued {
		t.Fatalf("c: %v, want queued behind b", r.Status)
	}
	rel, err = g.ReleaseAndWake(ctx, failingNotifier{}, "p", "b")
	if !errors.Is(err, ErrNotWoken) || !slices.Equal(IDs(rel.Woken), []string{"c"}) {
		t.Fatalf("released %+v, %v; want c granted and ErrNotWoken", rel, err)
	}
}
