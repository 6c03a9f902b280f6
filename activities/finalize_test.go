package activities_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

func finalize(t *testing.T, h *harness, in activities.FinalizeInput) {
	t.Helper()
	if _, err := local[struct{}](t, h, h.acts.Finalize, in); err != nil {
		t.Fatal(err)
	}
}

func done(requestID string) activities.FinalizeInput {
	return activities.FinalizeInput{
		RequestID: requestID, Pool: request.PoolShort, EventType: events.TypeDone,
		Done:   &activities.DoneFacts{RequestID: requestID, Route: request.PoolShort},
		Answer: &activities.Answer{FinishReason: "stop"},
	}
}

func TestFinalizeHandsPermitToNextWaiter(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	h.admit(t, "waiter", "queued")
	finalize(t, h, done("holder"))

	if got, want := h.notifier.woken(), []string{"short/waiter"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "waiter"); !ok {
		t.Fatal("the waiter was not handed the permit")
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "holder"); ok {
		t.Fatal("the finalized request still holds its permit")
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want the permit in use by the waiter and nobody queued", s)
	}
	last, ok, err := h.log.Last(context.Background(), "holder")
	if err != nil || !ok || last.Type != events.TypeDone {
		t.Fatalf("last event %+v, %v, %v: want done", last, ok, err)
	}
	if d := decode[events.Done](t, last); d.RequestID != "holder" || d.Route != request.PoolShort {
		t.Fatalf("done event %+v", d)
	}
}

func TestFinalizeAllPools(t *testing.T) {
	h := newHarness(t, nil)
	// Admission's answer was lost: the request may hold something in
	// either pool, here a permit in one and a queue place in the other.
	h.enqueue(t, request.PoolShort, "r1")
	h.enqueue(t, request.PoolLong, "other")
	if res := h.enqueue(t, request.PoolLong, "r1"); res.Status != admission.Queued {
		t.Fatalf("r1 in long: %v, want queued", res.Status)
	}
	finalize(t, h, activities.FinalizeInput{
		RequestID: "r1", AllPools: true, EventType: events.TypeError,
		Failure: &events.Failure{Reason: "cancelled", Message: "cancelled"},
	})
	if s := h.stats(t, request.PoolShort); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("short: %+v, want the permit back", s)
	}
	if s := h.stats(t, request.PoolLong); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("long: %+v, want the queue place given up", s)
	}
	for _, pool := range h.gate.Pools() {
		if res := h.enqueue(t, pool, "r1"); res.Status != admission.Gone {
			t.Fatalf("r1 in %s after finalize: %v, want gone", pool, res.Status)
		}
	}
	last, ok, err := h.log.Last(context.Background(), "r1")
	if err != nil || !ok || last.Type != events.TypeError {
		t.Fatalf("last event %+v, %v, %v: want error", last, ok, err)
	}
	if f := decode[events.Failure](t, last); f.Reason != "cancelled" {
		t.Fatalf("failure event %+v", f)
	}
}

func TestFinalizeSkipsGoneWaiter(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	h.admit(t, "gone", "queued")
	h.admit(t, "live", "queued")
	h.notifier.setGone("gone")
	finalize(t, h, done("holder"))

	if got, want := h.notifier.woken(), []string{"short/gone", "short/live"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "live"); !ok {
		t.Fatal("the live waiter was not handed the permit")
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "gone"); ok {
		t.Fatal("the gone waiter kept its permit")
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want one permit in use and nobody queued", s)
	}
}

func TestFinalizeTwiceFreesOnce(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	h.admit(t, "next", "queued")
	h.admit(t, "after", "queued")
	finalize(t, h, done("holder"))
	finalize(t, h, done("holder"))

	if got, want := h.notifier.woken(), []string{"short/next"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 1 {
		t.Fatalf("stats %+v: the second finalize freed a permit", s)
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "after"); ok {
		t.Fatal("the second finalize granted the next waiter too")
	}
}

func TestFinalizeStopsRunningStream(t *testing.T) {
	var h *harness
	fake := &fakeLLM{tokens: words(200), delay: time.Millisecond}
	fake.onToken = func(i int) bool {
		if i == 1 {
			in := done("r1")
			in.StopStream = true
			// Not t.Fatal: this runs inside the activity.
			if _, err := local[struct{}](t, h, h.acts.Finalize, in); err != nil {
				t.Error(err)
			}
		}
		return false
	}
	h = newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	wantAppError(t, err, activities.ErrTypeCancelled, true)
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n > 4 {
		t.Fatalf("%d tokens streamed after the stop flag was raised at token 1", n)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 0 {
		t.Fatalf("stats %+v, want the permit released", s)
	}
}

// Finalize replaces the request's budget charge (its bound) with the
// tokens it used, priced as charged when it does not say where it was
// answered, once however often it is retried.
func TestFinalizeSettlesTheBudgetOnce(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	lim := budget.Limit{Tokens: 10000, Micros: 1_000_000}
	ch := budget.Charge{Tenant: "acme", RequestID: "r1", PromptTokens: 500, OutputTokens: 1000, Price: budget.Price{Input: 1, Output: 3}}
	d, err := h.acts.Budgets.Reserve(ctx, ch, lim)
	if err != nil || !d.Allowed || d.Used != (budget.Used{Tokens: 1500, Micros: 3500}) {
		t.Fatalf("reserve: %+v, %v", d, err)
	}
	h.admit(t, "r1", "granted")
	in := done("r1")
	in.Budget = &activities.BudgetSettle{Reservation: d.Reservation, PromptTokens: 400, CompletionTokens: 100}
	finalize(t, h, in)
	finalize(t, h, in)
	s, err := h.acts.Budgets.Status(ctx, "acme", lim)
	if err != nil {
		t.Fatal(err)
	}
	if want := (budget.Used{Tokens: 500, Micros: 700}); s.Used != want {
		t.Fatalf("used %+v after finalizing twice, want %+v (400 prompt at 1, 100 completion at 3)", s.Used, want)
	}
}

// Finalize settles a budget charge at the price of the model that
// answered (a fallback's), not the one the charge was priced at.
func TestFinalizeSettlesTheBudgetAtTheModelThatAnswered(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	lim := budget.Limit{Micros: 1_000_000}
	ch := budget.Charge{Tenant: "acme", RequestID: "r1", PromptTokens: 500, OutputTokens: 1000, Price: budget.Price{Input: 1, Output: 3}}
	d, err := h.acts.Budgets.Reserve(ctx, ch, lim)
	if err != nil || !d.Allowed {
		t.Fatalf("reserve: %+v, %v", d, err)
	}
	h.admit(t, "r1", "granted")
	in := done("r1")
	in.Budget = &activities.BudgetSettle{Reservation: d.Reservation, PromptTokens: 400, CompletionTokens: 100,
		Pool: request.PoolShort, Model: "fallback"}
	finalize(t, h, in)
	s, err := h.acts.Budgets.Status(ctx, "acme", lim)
	if err != nil {
		t.Fatal(err)
	}
	if want := (budget.Used{Tokens: 500, Micros: 1300}); s.Used != want {
		t.Fatalf("used %+v, want %+v (400 prompt at 2, 100 completion at 5: the fallback's price)", s.Used, want)
	}
}
