package waitroom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func newRoom(t *testing.T, slots, capacity int, ready Ready) *Room {
	t.Helper()
	return runRoom(t, Options{Slots: slots, Capacity: capacity, Ready: ready})
}

// runRoom makes a room of opts, polling every 5ms and logging nowhere, and
// runs it until the test ends.
func runRoom(t *testing.T, opts Options) *Room {
	t.Helper()
	opts.Poll, opts.Logger = 5*time.Millisecond, slog.New(slog.DiscardHandler)
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func enter(t *testing.T, r *Room, tenant string, weight int, ready bool) *Waiter {
	t.Helper()
	w, err := r.Enter(Ticket{Pool: "short", Tenant: tenant, Weight: weight}, ready)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func admitted(w *Waiter, within time.Duration) bool {
	select {
	case <-w.Admitted():
		return true
	default:
	}
	select {
	case <-w.Admitted():
		return true
	case <-time.After(within):
		return false
	}
}

// A free slot and a ready pool admit at once; without a slot the request
// waits, and is admitted when a slot is given back.
func TestSlotsAdmitInTurn(t *testing.T) {
	r := newRoom(t, 1, 10, nil)
	first := enter(t, r, "a", 1, true)
	if !admitted(first, 0) {
		t.Fatal("a free slot did not admit at once")
	}
	second := enter(t, r, "a", 1, true)
	if admitted(second, 20*time.Millisecond) {
		t.Fatal("admitted without a free slot")
	}
	if p := second.Position(); p != 1 {
		t.Fatalf("position %d, want 1", p)
	}
	first.Leave()
	first.Leave() // twice gives back one slot
	if !admitted(second, time.Second) {
		t.Fatal("a given-back slot did not admit the next waiter")
	}
	if st := r.Stats(); st.Waiting != 0 || st.Starting != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A pool that cannot take more keeps its waiters, whatever the slots; it
// is asked again until it can, and told how many are already starting.
func TestWaitsForItsPoolToBeReady(t *testing.T) {
	var open atomic.Bool
	var starting atomic.Int64
	r := newRoom(t, 4, 10, func(_ context.Context, _ string, n int) (bool, error) {
		starting.Store(int64(n))
		return open.Load(), nil
	})
	held := enter(t, r, "a", 1, true)
	w := enter(t, r, "a", 1, false)
	if admitted(w, 30*time.Millisecond) {
		t.Fatal("admitted while its pool was not ready")
	}
	if starting.Load() != 1 {
		t.Fatalf("Ready was told %d starts in flight, want 1", starting.Load())
	}
	open.Store(true)
	if !admitted(w, time.Second) {
		t.Fatal("not admitted once its pool was ready")
	}
	held.Leave()
	w.Leave()
}

// A pool whose readiness cannot be read keeps its waiters rather than
// flooding it.
func TestReadyErrorKeepsWaiting(t *testing.T) {
	r := newRoom(t, 1, 10, func(context.Context, string, int) (bool, error) {
		return false, errors.New("redis down")
	})
	w := enter(t, r, "a", 1, false)
	if admitted(w, 30*time.Millisecond) {
		t.Fatal("admitted although its pool's readiness was unknown")
	}
	w.Leave()
	if st := r.Stats(); st.Waiting != 0 {
		t.Fatalf("stats %+v after leaving", st)
	}
}

// Backlogged tenants leave in proportion to their weights, each in its
// own arrival order.
func TestWeightedFairOrder(t *testing.T) {
	r := newRoom(t, 1, 100, nil)
	blocker := enter(t, r, "x", 1, true)
	var ws []*Waiter
	names := map[*Waiter]string{}
	for i := range 12 {
		for _, tc := range []struct {
			tenant string
			weight int
		}{{"vip", 3}, {"free", 1}} {
			w := enter(t, r, tc.tenant, tc.weight, true)
			ws = append(ws, w)
			names[w] = fmt.Sprintf("%s#%d", tc.tenant, i)
		}
	}
	var order []string
	blocker.Leave()
	for range 16 {
		var next *Waiter
		deadline := time.After(time.Second)
		for next == nil {
			for _, w := range ws {
				select {
				case <-w.Admitted():
					if w.state != gone {
						next = w
					}
				default:
				}
			}
			select {
			case <-deadline:
				t.Fatalf("nobody admitted after %v", order)
			default:
			}
		}
		order = append(order, names[next])
		next.Leave()
	}
	vip := 0
	for _, o := range order {
		if o[:3] == "vip" {
			vip++
		}
	}
	if vip != 12 {
		t.Fatalf("first 16 admitted %v: %d vip, want 12 (3:1)", order, vip)
	}
	next := map[string]int{}
	for _, o := range order {
		tenant, n, _ := strings.Cut(o, "#")
		if want := fmt.Sprint(next[tenant]); n != want {
			t.Fatalf("order %v: %s out of its tenant's arrival order", order, o)
		}
		next[tenant]++
	}
}

func TestCapacityAndTenantCap(t *testing.T) {
	r := newRoom(t, 1, 2, nil)
	enter(t, r, "a", 1, true) // holds the slot
	if _, err := r.Enter(Ticket{Pool: "short", Tenant: "a", Weight: 1, MaxPerTenant: 1}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Enter(Ticket{Pool: "short", Tenant: "a", Weight: 1, MaxPerTenant: 1}, true); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("tenant over its cap: %v", err)
	}
	enter(t, r, "b", 1, true)
	if _, err := r.Enter(Ticket{Pool: "short", Tenant: "c", Weight: 1}, true); !errors.Is(err, ErrFull) {
		t.Fatalf("room over capacity: %v", err)
	}
	if _, err := r.Enter(Ticket{Pool: "short", Tenant: "c"}, true); err == nil {
		t.Fatal("a zero weight was accepted")
	}
}

// Positions follow the line and move up when someone ahead leaves.
func TestPositions(t *testing.T) {
	r := newRoom(t, 1, 10, nil)
	enter(t, r, "x", 1, true)
	a, b, c := enter(t, r, "a", 1, true), enter(t, r, "b", 1, true), enter(t, r, "c", 1, true)
	if a.Position() != 1 || b.Position() != 2 || c.Position() != 3 {
		t.Fatalf("positions %d %d %d", a.Position(), b.Position(), c.Position())
	}
	b.Leave()
	if a.Position() != 1 || c.Position() != 2 || b.Position() != 0 {
		t.Fatalf("after b left: %d %d %d", a.Position(), c.Position(), b.Position())
	}
}

// A started request keeps counting toward its pool's starts until it has
// reached the pool's queue (settled), however long that takes, while its
// slot is free at once; and at most for its bound.
func TestStartedSettles(t *testing.T) {
	var seen atomic.Int64
	r := newRoom(t, 1, 10, func(_ context.Context, _ string, starting int) (bool, error) {
		seen.Store(int64(starting))
		return starting == 0, nil
	})
	first := enter(t, r, "a", 1, true)
	second := enter(t, r, "a", 1, false)
	settled := make(chan struct{})
	first.Started(settled, time.Minute)
	first.Leave() // after Started: nothing more to give back
	if admitted(second, 300*time.Millisecond) {
		t.Fatal("admitted while the first start had not reached the queue")
	}
	if seen.Load() != 1 {
		t.Fatalf("Ready saw %d starting, want 1", seen.Load())
	}
	close(settled)
	if !admitted(second, time.Second) {
		t.Fatal("not admitted once the first start settled")
	}
	if st := r.Stats(); st.Starting != 1 {
		t.Fatalf("stats %+v: the first slot was given back", st)
	}
	// A start that never reports it settled stops counting at its bound.
	third := enter(t, r, "a", 1, false)
	second.Started(make(chan struct{}), 100*time.Millisecond)
	if !admitted(third, time.Second) {
		t.Fatal("not admitted after the second start's bound")
	}
}

// Waiters' costs are their tokens: a tenant sending 8k-token prompts and
// one sending 100-token prompts, at equal weights, leave with equal shares
// of the tokens, not of the requests.
func TestTokenFairOrder(t *testing.T) {
	r := newRoom(t, 1, 1000, nil)
	enter(t, r, "x", 1, true) // holds the only slot: everyone else waits
	tokens := map[*Waiter]int{}
	tenant := map[*Waiter]string{}
	for i := range 300 {
		for _, s := range []struct {
			name   string
			tokens int
		}{{"long", 8000 + 512}, {"brief", 100 + 512}} {
			if s.name == "long" && i >= 30 {
				continue
			}
			w, err := r.Enter(Ticket{Pool: "short", Tenant: s.name, Weight: 1, Cost: float64(s.tokens) / 1000}, true)
			if err != nil {
				t.Fatal(err)
			}
			tokens[w], tenant[w] = s.tokens, s.name
		}
	}
	// The first 150 to leave, while both are still backlogged.
	got := map[string]int{}
	for w, n := range tokens {
		if p := w.Position(); p <= 150 {
			got[tenant[w]] += n
		}
	}
	share := float64(got["long"]) / float64(got["long"]+got["brief"])
	t.Logf("long prompts' share of the tokens of the first 150 to leave: %.1f%%", 100*share)
	if share < 0.45 || share > 0.55 {
		t.Fatalf("long prompts got %.1f%% of the tokens, want 50%% ± 5", 100*share)
	}
	if _, err := r.Enter(Ticket{Pool: "short", Tenant: "c", Weight: 1, Cost: -1}, true); err == nil {
		t.Fatal("a negative cost was accepted")
	}
}

// A request the pool's fair order puts within its queue's bound (Pass)
// takes a free slot past the line of a pool that is not ready; one whose
// tenant already waits here does not, so its tenant's order holds.
func TestPassTakesAFreeSlotPastTheLine(t *testing.T) {
	r := newRoom(t, 4, 10, func(context.Context, string, int) (bool, error) { return false, nil })
	heavy := enter(t, r, "heavy", 1, false)
	if admitted(heavy, 20*time.Millisecond) {
		t.Fatal("admitted while its pool was not ready")
	}
	pass := func(tenant string) *Waiter {
		t.Helper()
		w, err := r.Enter(Ticket{Pool: "short", Tenant: tenant, Weight: 5, Pass: true}, true)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	vip := pass("vip")
	if !admitted(vip, 0) {
		t.Fatal("a passing request waited behind the line")
	}
	again := pass("heavy")
	if admitted(again, 20*time.Millisecond) {
		t.Fatal("a passing request went ahead of its own tenant's waiter")
	}
	if heavy.Position() != 1 || again.Position() != 2 {
		t.Fatalf("positions %d, %d; want 1, 2", heavy.Position(), again.Position())
	}
}

// Tagged waiters line up at their reserved tags moved on by what their
// tenants' streams were charged since (Options.Shifts): a tenant charged
// past another's place leaves after it, though it reserved first.
func TestTaggedWaitersMoveWithTheirTenantsCharges(t *testing.T) {
	var open atomic.Bool
	var reads atomic.Int64
	r := runRoom(t, Options{
		Slots: 1, Capacity: 10,
		Ready: func(context.Context, string, int) (bool, error) { return open.Load(), nil },
		Shifts: func(context.Context, string) (map[string]int64, error) {
			reads.Add(1)
			return map[string]int64{"a": 700, "b": 50}, nil
		},
	})
	// a reserved at 100 when its shift was 200 (now 700: moved to 600);
	// b at 300 when its shift was 50 (not moved).
	a, err := r.Enter(Ticket{Pool: "short", Tenant: "a", Weight: 1, Tag: 100, Shift: 200}, false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Enter(Ticket{Pool: "short", Tenant: "b", Weight: 1, Tag: 300, Shift: 50}, false)
	if err != nil {
		t.Fatal(err)
	}
	if a.Position() != 1 {
		t.Fatalf("before the shifts are read a is at %d, want 1 (its reserved tag is first)", a.Position())
	}
	open.Store(true)
	r.nudge()
	if !admitted(b, time.Second) {
		t.Fatal("b, ahead of a's moved place, was not admitted")
	}
	if admitted(a, 20*time.Millisecond) {
		t.Fatal("a was admitted with b's slot")
	}
	if reads.Load() == 0 {
		t.Fatal("the shifts were never read")
	}
}
