package admission

import (
	"context"
	"sync"
	"testing"
	"time"
)

// holdLog is a HoldRecorder that keeps what it hears, per pool.
type holdLog struct {
	mu    sync.Mutex
	calls map[string]int
	total map[string]time.Duration
}

func newHoldLog() *holdLog {
	return &holdLog{calls: map[string]int{}, total: map[string]time.Duration{}}
}

func (h *holdLog) PermitHeld(pool string, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls[pool]++
	h.total[pool] += d
}

func (h *holdLog) get(pool string) (int, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[pool], h.total[pool]
}

// A released permit's hold is told once, by the release that gave it
// back: a second release, a queued request's release and a release
// through ReleaseAndWake or Wake's own release of a gone waiter tell
// nothing more, or their own permit's hold.
func TestReleaseTellsHoldOnce(t *testing.T) {
	holds := newHoldLog()
	g, _ := newGate(t, 1, func(o *Options) { o.Holds = holds })
	ctx := context.Background()
	mustEnqueue(t, g, "a")
	if r := mustEnqueue(t, g, "b"); r.Status != Queued {
		t.Fatalf("b: %v, want queued", r.Status)
	}
	time.Sleep(60 * time.Millisecond)
	rel, err := g.Release(ctx, "p", "a")
	if err != nil {
		t.Fatal(err)
	}
	if !rel.HeldPermit || rel.Held < 50*time.Millisecond || rel.Held > 5*time.Second {
		t.Fatalf("release of a ~60ms hold: %+v", rel)
	}
	if n, d := holds.get("p"); n != 1 || d != rel.Held {
		t.Fatalf("after one release heard %d holds, %v; want 1, %v", n, d, rel.Held)
	}
	again, err := g.Release(ctx, "p", "a")
	if err != nil {
		t.Fatal(err)
	}
	if again.HeldPermit || again.Held != 0 {
		t.Fatalf("second release: %+v, want nothing", again)
	}
	// b was granted a's permit; its waiter is gone, so Wake releases it
	// (a hold of a whole millisecond or more: one of 0 ms adds nothing).
	time.Sleep(5 * time.Millisecond)
	if err := Wake(ctx, g, goneNotifier{}, rel.Woken); err != nil {
		t.Fatal(err)
	}
	if n, _ := holds.get("p"); n != 2 {
		t.Fatalf("after Wake gave back b's permit heard %d holds, want 2", n)
	}
	if _, err := g.ReleaseAndWake(ctx, goneNotifier{}, "p", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Release(ctx, "p", "never"); err != nil {
		t.Fatal(err)
	}
	if n, _ := holds.get("p"); n != 2 {
		t.Fatalf("a release of nothing was heard: %d holds", n)
	}
}

// goneNotifier finds every waiter gone.
type goneNotifier struct{}

func (goneNotifier) NotifyGranted(context.Context, string, string) (bool, error) { return true, nil }

// A permit whose lease ran out is told by the next Pump of its pool, held
// from its grant to its lease's end, once: whichever script reclaimed it
// (here a release of another request), and however many pumps follow.
func TestExpiredPermitHoldToldByPumpOnce(t *testing.T) {
	holds := newHoldLog()
	const lease = 150 * time.Millisecond
	g, _ := newGate(t, 2, func(o *Options) { o.Lease = lease; o.Holds = holds })
	ctx := context.Background()
	mustEnqueue(t, g, "crashed")
	mustEnqueue(t, g, "other")
	time.Sleep(300 * time.Millisecond)
	// other's release reclaims both expired permits before its own: its
	// own permit was dropped as expired too, so it tells nothing itself.
	rel, err := g.Release(ctx, "p", "other")
	if err != nil {
		t.Fatal(err)
	}
	if rel.HeldPermit {
		t.Fatalf("release of an expired permit: %+v, want none held", rel)
	}
	if n, _ := holds.get("p"); n != 0 {
		t.Fatalf("expired holds heard before a pump: %d", n)
	}
	if _, err := g.Pump(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	n, d := holds.get("p")
	if n != 1 || d < 2*lease-20*time.Millisecond || d > 2*lease+100*time.Millisecond {
		t.Fatalf("after a pump heard %d holds of %v in all; want one of about 2 × %v (two leases)", n, d, lease)
	}
	for range 2 {
		if _, err := g.Pump(ctx, "p"); err != nil {
			t.Fatal(err)
		}
	}
	if n2, d2 := holds.get("p"); n2 != n || d2 != d {
		t.Fatalf("later pumps told more: %d holds, %v", n2, d2)
	}
}

// In a group, a pool's expired permits are its own pump's to tell, even
// when the other pool's script reclaimed them.
func TestExpiredHoldStaysWithItsPool(t *testing.T) {
	holds := newHoldLog()
	const lease = 150 * time.Millisecond
	g, _ := newGate(t, 1, func(o *Options) {
		o.Limits = map[string]int{"short": 2, "long": 2}
		o.Groups = []Group{{Pools: []string{"short", "long"}, Limit: 2}}
		o.Lease, o.Holds = lease, holds
	})
	ctx := context.Background()
	enqueueIn(t, g, "long", Request{ID: "l", Tenant: "a"})
	time.Sleep(300 * time.Millisecond)
	if _, err := g.Pump(ctx, "short"); err != nil {
		t.Fatal(err)
	}
	if n, _ := holds.get("short"); n != 0 {
		t.Fatalf("short told %d holds of long's permit", n)
	}
	if n, _ := holds.get("long"); n != 0 {
		t.Fatalf("long's hold told before its own pump: %d", n)
	}
	if _, err := g.Pump(ctx, "long"); err != nil {
		t.Fatal(err)
	}
	if n, d := holds.get("long"); n != 1 || d < lease-20*time.Millisecond || d > lease+100*time.Millisecond {
		t.Fatalf("long heard %d holds, %v; want one of about %v", n, d, lease)
	}
}
