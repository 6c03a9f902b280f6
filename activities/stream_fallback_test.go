package activities_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
)

// wantFallen checks that err tells the workflow to fall back, for reason,
// from model, and that no token was streamed.
func wantFallen(t *testing.T, h *harness, err error, requestID, reason, model string) {
	t.Helper()
	wantAppError(t, err, activities.ErrTypeFallback, true)
	var f activities.Fallen
	if err := appError(t, err).Details(&f); err != nil {
		t.Fatalf("details: %v", err)
	}
	if f.Reason != reason || f.Model != model {
		t.Fatalf("fallen %+v, want reason %s from %s", f, reason, model)
	}
	if n := len(ofType(h.events(t, requestID), events.TypeToken)); n != 0 {
		t.Fatalf("%d tokens streamed before falling back", n)
	}
}

// streamInput is a request for the harness's short pool with its context.
func streamInput(t *testing.T, h *harness, requestID string, fallBack bool) activities.LLMInput {
	t.Helper()
	version, hits := h.retrieveContext(t, requestID, 10, 3)
	return activities.LLMInput{RequestID: requestID, Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits, MaxTokens: 20, FallBack: fallBack}
}

// A pool whose every circuit is open tells a request with a fallback
// left to take it; one without is refused as before.
func TestStreamLLMFallsBackWhenEveryCircuitIsOpen(t *testing.T) {
	_, client := faultySimulator(t, llmsim.Fault{ErrorStatus: 503})
	h := newHarness(t, func(o *harnessOptions) { o.streamer, o.limits = client, roomFor(4) })
	// The 503 is no trigger: the next endpoint may answer. It opens the
	// circuit.
	_, err := stream(t, h, streamInput(t, h, "r1", true), nil)
	wantAppError(t, err, activities.ErrTypeBackend, false)

	_, err = stream(t, h, streamInput(t, h, "r2", true), nil)
	wantFallen(t, h, err, "r2", request.ReasonBackendUnavailable, "fake")

	_, err = stream(t, h, streamInput(t, h, "r3", false), nil)
	wantAppError(t, err, activities.ErrTypeBackendUnavailable, true)
}

// A backend that answers that the prompt exceeds its model's context
// tells a request with a fallback left to take it; one without is
// refused as a bad request, as before.
func TestStreamLLMFallsBackWhenTheContextIsTooLong(t *testing.T) {
	_, srv := simulator(t, func(cfg *llmsim.Config) { cfg.MaxModelLen = 64 })
	client, err := llm.NewOpenAI(llm.OpenAIOptions{Name: request.PoolShort, Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer, o.limits = client, roomFor(4) })
	_, err = stream(t, h, streamInput(t, h, "r1", true), nil)
	wantFallen(t, h, err, "r1", request.FallbackContextTooLong, "fake")

	_, err = stream(t, h, streamInput(t, h, "r2", false), nil)
	wantAppError(t, err, activities.ErrTypeBadRequest, true)
}

// A first token that misses its deadline on the pool's last attempt (one
// per endpoint) tells a request with a fallback left to take it; on an
// earlier attempt it is retried, the next endpoint's turn, as before.
func TestStreamLLMFallsBackWhenTheFirstTokenIsLateEverywhere(t *testing.T) {
	_, srv := simulator(t, func(cfg *llmsim.Config) { cfg.Fault = llmsim.Fault{StallFirstToken: true} })
	client, err := llm.NewOpenAI(llm.OpenAIOptions{
		Name: request.PoolShort, Endpoints: []string{srv.URL},
		Deadlines: llm.Deadlines{FirstToken: 200 * time.Millisecond},
		// The deadlines must not open the circuit here.
		Breaker: llm.Breaker{Failures: 100, OpenFor: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer, o.limits = client, roomFor(4) })
	_, err = stream(t, h, streamInput(t, h, "r1", true), nil)
	wantFallen(t, h, err, "r1", request.FallbackFirstTokenTimeout, "fake")

	_, err = stream(t, h, streamInput(t, h, "r2", false), nil)
	wantAppError(t, err, activities.ErrTypeBackend, false)

	// Two endpoints: the first attempt has not tried the second.
	pool := h.acts.Pools[request.PoolShort]
	pool.Endpoints = 2
	h.acts.Pools[request.PoolShort] = pool
	_, err = stream(t, h, streamInput(t, h, "r3", true), nil)
	wantAppError(t, err, activities.ErrTypeBackend, false)
}

// A model fallback asks the pool's endpoints for its model, which the
// answer names.
func TestStreamLLMAsksForTheFallbackModel(t *testing.T) {
	_, srv := simulator(t, nil)
	client, err := llm.NewOpenAI(llm.OpenAIOptions{Name: request.PoolShort, Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer, o.limits = client, roomFor(4) })
	in := streamInput(t, h, "r1", false)
	in.Model = "sluice-sim-small"
	in.Done = &activities.DoneFacts{RequestID: "r1", Route: request.PoolShort,
		Fallback: &events.Fallback{From: "fake", To: "sluice-sim-small", FromPool: request.PoolShort, ToPool: request.PoolShort, Reason: request.FallbackContextTooLong}}
	out, err := stream(t, h, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.Model != "sluice-sim-small" {
		t.Fatalf("answered by %q, want the fallback model", out.Model)
	}
	done := ofType(h.events(t, "r1"), events.TypeDone)
	if len(done) != 1 {
		t.Fatalf("%d done events", len(done))
	}
	var d events.Done
	if err := json.Unmarshal(done[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.Model != "sluice-sim-small" || d.Fallback == nil || *d.Fallback != *in.Done.Fallback {
		t.Fatalf("done says model %q, fallback %+v", d.Model, d.Fallback)
	}
}

// roomFor is permits for n streams in each pool, none of them released.
func roomFor(n int) map[string]int {
	return map[string]int{request.PoolShort: n, request.PoolLong: n}
}
