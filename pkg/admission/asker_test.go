package admission

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

func newAsker(t *testing.T, limit int) (*Gate, *Asker) {
	t.Helper()
	g, rdb := newGate(t, limit, nil)
	w, err := NewWaker(context.Background(), rdb, g)
	if err != nil {
		t.Fatal(err)
	}
	a := NewAsker(g, w, PauseRules{MinTokens: 10, MaxPauses: 2}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() {
		a.Close()
		_ = w.Close()
	})
	return g, a
}

func TestPreemptTellsAWaiterThatIsNotQueued(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	grantAll(t, g, "flex")
	_, err := g.Preempt(context.Background(), "p", "nobody", 0, PauseRules{MinTokens: 1, MaxPauses: 1})
	if !errors.Is(err, ErrNotQueued) {
		t.Fatalf("Preempt for a waiter never queued: %v, want ErrNotQueued", err)
	}
	_, err = g.Preempt(context.Background(), "p", "flex", 0, PauseRules{MinTokens: 1, MaxPauses: 1})
	if !errors.Is(err, ErrNotQueued) {
		t.Fatalf("Preempt for a granted request: %v, want ErrNotQueued", err)
	}
}

// askedFor waits until victim is asked to pause, and returns for whom.
func askedFor(t *testing.T, g *Gate, victim string, rank, tokens int) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if w := pausable(t, g, victim, rank, 0, tokens); w != "" {
			return w
		}
	}
	t.Fatalf("%s was never asked to pause", victim)
	return ""
}

// An urgent waiter that queued while every less urgent stream was within
// its first MinTokens tokens finds none to pause then; the Asker asks
// for it again when a stream announces it may be paused, without the
// waiter asking, and forgets it once it is granted.
func TestAskerAsksAgainWhenAStreamBecomesPausable(t *testing.T) {
	g, a := newAsker(t, 1)
	a.every = time.Hour // only the announcement prompts a round
	ctx := context.Background()
	grantAll(t, g, "flex")
	pausable(t, g, "flex", 2, 0, 3)
	mustEnqueueReq(t, g, Request{ID: "urgent", Tenant: "t-urgent", Weight: 1})
	victim, err := a.Want(ctx, "p", "urgent", 0, time.Minute)
	if err != nil || victim != "" {
		t.Fatalf("first ask: %q, %v; want none (flex within its first tokens)", victim, err)
	}
	if a.Waiting() != 1 {
		t.Fatalf("asking for %d waiters, want 1", a.Waiting())
	}
	pausable(t, g, "flex", 2, 0, 10)
	if err := g.AnnouncePausable(ctx); err != nil {
		t.Fatal(err)
	}
	if w := askedFor(t, g, "flex", 2, 10); w != "urgent" {
		t.Fatalf("flex asked to pause for %q, want urgent", w)
	}
	y, err := g.Yield(ctx, "p", YieldRequest{ID: "flex", Weight: 1, Class: "flex"})
	if err != nil || !y.Paused {
		t.Fatalf("yield: %+v, %v", y, err)
	}
	// Its next round, here prompted by another announcement, finds it
	// granted.
	if err := g.AnnouncePausable(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); a.Waiting() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Asker still asks for a granted waiter")
		}
	}
}

// Without any announcement (they are at most once), the Asker's own
// rounds find the stream; a waiter whose wait ended is forgotten.
func TestAskerAsksEveryRoundAndForgetsAnEndedWait(t *testing.T) {
	g, a := newAsker(t, 1)
	ctx := context.Background()
	grantAll(t, g, "flex")
	mustEnqueueReq(t, g, Request{ID: "urgent", Tenant: "t-urgent", Weight: 1})
	mustEnqueueReq(t, g, Request{ID: "brief", Tenant: "t-brief", Weight: 1})
	if _, err := a.Want(ctx, "p", "urgent", 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Want(ctx, "p", "brief", 1, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	pausable(t, g, "flex", 2, 0, 50)
	if w := askedFor(t, g, "flex", 2, 50); w != "urgent" {
		t.Fatalf("flex asked to pause for %q, want urgent (the more urgent waiter)", w)
	}
	for deadline := time.Now().Add(10 * time.Second); a.Waiting() > 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Asker still asks for a waiter whose wait ended")
		}
	}
}

// Want for a waiter already granted asks nothing and keeps nothing.
func TestAskerKeepsNoWaiterThatIsNotQueued(t *testing.T) {
	g, a := newAsker(t, 1)
	grantAll(t, g, "flex")
	if v, err := a.Want(context.Background(), "p", "flex", 0, time.Minute); err != nil || v != "" {
		t.Fatalf("Want for a granted request: %q, %v", v, err)
	}
	if a.Waiting() != 0 {
		t.Fatalf("asking for %d waiters, want 0", a.Waiting())
	}
}
