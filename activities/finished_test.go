package activities_test

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// TestFinalizeLogsTheRequestOnce: Finalize writes the request's one line
// from the workflow's report, and a Finalize without a report (the durable
// retry) writes none.
func TestFinalizeLogsTheRequestOnce(t *testing.T) {
	h := newHarness(t, nil)
	var buf bytes.Buffer
	h.acts.Logger = slog.New(slog.NewJSONHandler(&buf, nil))
	h.admit(t, "logged", "granted")
	in := done("logged")
	in.Report = &activities.Report{
		Route: request.PoolShort, Outcome: request.OutcomeDone, Tenant: "acme", ServiceTier: request.ClassPriority,
		Usage: events.Usage{PromptTokens: 90, CompletionTokens: 12, TotalTokens: 102},
		Timings: []events.StageTiming{
			{Stage: request.StageEmbed, Ms: 1, Cache: "memory"}, {Stage: request.StageAnswerCache, Ms: 2, Cache: "miss"},
			{Stage: request.StageAdmission, Ms: 3}, {Stage: request.StageRetrieval, Ms: 4, Cache: "redis"},
			{Stage: request.StageRerank, Ms: 5}, {Stage: request.StageLLMFirstToken, Ms: 6}, {Stage: request.StageLLM, Ms: 70},
		},
	}
	finalize(t, h, in)
	in.Report = nil
	finalize(t, h, in)
	lines := testenv.FinishedLines(buf.String())
	if len(lines) != 1 {
		t.Fatalf("%d request lines, want 1:\n%s", len(lines), buf.String())
	}
	want := map[string]any{
		"requestID": "logged", "tenant": "acme", "route": "short", "outcome": "done", "reason": "",
		"embed_ms": 1.0, "answer_cache_ms": 2.0, "queue_wait_ms": 3.0, "retrieval_ms": 4.0, "rerank_ms": 5.0,
		"llm_first_token_ms": 6.0, "llm_ms": 70.0, "ttft_ms": 21.0,
		"prompt_tokens": 90.0, "completion_tokens": 12.0, "cached": "embedding:memory,retrieval:redis",
		"service_tier": "priority",
	}
	for k, v := range want {
		if lines[0][k] != v {
			t.Errorf("%s = %v, want %v", k, lines[0][k], v)
		}
	}
}

func TestFinalizeLogsAnAnswerCacheHit(t *testing.T) {
	h := newHarness(t, nil)
	var buf bytes.Buffer
	h.acts.Logger = slog.New(slog.NewJSONHandler(&buf, nil))
	in := activities.FinalizeInput{RequestID: "hit", Report: &activities.Report{
		Route: request.RouteCache, Outcome: request.OutcomeDone,
		Timings: []events.StageTiming{{Stage: request.StageEmbed, Ms: 1, Cache: "redis"}, {Stage: request.StageAnswerCache, Ms: 2, Cache: "hit"}},
	}}
	finalize(t, h, in)
	lines := testenv.FinishedLines(buf.String())
	if len(lines) != 1 || lines[0]["cached"] != "answer" || lines[0]["route"] != request.RouteCache {
		t.Fatalf("lines %v", lines)
	}
	if _, ok := lines[0]["ttft_ms"]; ok {
		t.Error("ttft_ms for an answer no model streamed")
	}
}
