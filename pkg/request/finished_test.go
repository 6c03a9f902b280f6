package request

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

func TestFinishedLogLine(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	Finished{
		RequestID: "chat-1", Tenant: "acme", Route: PoolShort, Outcome: OutcomeDone,
		Stages: []StageTime{
			{StageEmbed, 2}, {StageAdmission, 5}, {StageAdmission, 7}, {StageRetrieval, 3},
			{StageRerank, 1}, {StageLLMFirstToken, 40}, {StageLLM, 900},
		},
		TTFT: 58 * time.Millisecond, PromptTokens: 120, CompletionTokens: 30,
		Cached: "embedding:memory", TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", ServiceTier: ClassFlex,
	}.Log(context.Background(), logger)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	want := map[string]any{
		"msg": "request finished", "requestID": "chat-1", "tenant": "acme", "route": "short", "outcome": "done", "reason": "",
		"embed_ms": 2.0, "queue_wait_ms": 12.0, "retrieval_ms": 3.0, "rerank_ms": 1.0, "llm_first_token_ms": 40.0, "llm_ms": 900.0,
		"ttft_ms": 58.0, "prompt_tokens": 120.0, "completion_tokens": 30.0, "cached": "embedding:memory",
		"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "service_tier": "flex",
	}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("%s = %v, want %v", k, line[k], v)
		}
	}
	// The answer cache's stage did not run: no key for it.
	if _, ok := line["answer_cache_ms"]; ok {
		t.Error("answer_cache_ms logged for a stage that did not run")
	}
}

func TestFinishedLogLineWithoutTrace(t *testing.T) {
	var buf bytes.Buffer
	Finished{RequestID: "chat-2", Outcome: OutcomeRejected, Reason: ReasonQueueTimeout}.Log(context.Background(), slog.New(slog.NewJSONHandler(&buf, nil)))
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"trace_id", "ttft_ms", "embed_ms", "service_tier"} {
		if _, ok := line[k]; ok {
			t.Errorf("%s logged for a request without it", k)
		}
	}
	if line["reason"] != ReasonQueueTimeout {
		t.Errorf("reason %v", line["reason"])
	}
}
