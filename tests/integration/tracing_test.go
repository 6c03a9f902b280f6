package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// tracedStack is a second API process (with its embedded worker) on the
// package's Temporal server and Redis, with tracing on into an in-memory
// exporter and its log in a buffer. Its own task queue and key prefix
// keep it apart from the package's stack, which runs untraced.
type tracedStack struct {
	url   string
	spans *tracetest.InMemoryExporter
	log   *testenv.SyncBuffer
}

func startTracedStack(t *testing.T) *tracedStack {
	t.Helper()
	ts := &tracedStack{spans: tracetest.NewInMemoryExporter(), log: &testenv.SyncBuffer{}}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(ts.spans))
	cfg := stack.cfg
	cfg.Temporal.TaskQueue = "sluice-traced"
	cfg.Redis.KeyPrefix = "ittr:"
	cfg.Metrics.Addr = "" // the package stack's API holds its port
	cfg.Log.Level = "info"
	logger := slog.New(slog.NewJSONHandler(ts.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// The wiring reads the provider while it builds the process.
	tracing.Install(tp)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	api, err := app.StartAPI(ctx, cfg, logger)
	cancel()
	tracing.Install(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := api.Stop(20 * time.Second); err != nil {
			t.Error(err)
		}
		_ = tp.Shutdown(context.Background())
	})
	ts.url = api.URL
	return ts
}

// ask sends one chat request with the client's traceparent and reads its
// stream to the end; it returns the done event and the answer.
func (ts *tracedStack) ask(t *testing.T, query, traceparent string) (events.Done, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/v1/chat",
		strings.NewReader(`{"query":"`+query+`","max_tokens":30}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k-acme")
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/chat: %d", resp.StatusCode)
	}
	r := testenv.NewSSEReader(resp.Body)
	var answer strings.Builder
	for {
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("stream ended before its end: %v", err)
		}
		if ev.Event == events.TypeToken {
			var tok events.Token
			_ = ev.Decode(&tok)
			answer.WriteString(tok.Text)
		}
		if !events.Terminal(ev.Event) {
			continue
		}
		var done events.Done
		if ev.Event != events.TypeDone || ev.Decode(&done) != nil {
			t.Fatalf("the request ended with %s: %s", ev.Event, ev.Data)
		}
		return done, answer.String()
	}
}

// waitForSpans waits until every span named in want has ended in trace.
func (ts *tracedStack) waitForSpans(t *testing.T, traceID trace.TraceID, want []string) []tracetest.SpanStub {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var spans []tracetest.SpanStub
		names := map[string]bool{}
		for _, s := range ts.spans.GetSpans() {
			if s.SpanContext.TraceID() == traceID {
				spans = append(spans, s)
				names[s.Name] = true
			}
		}
		var missing []string
		for _, n := range want {
			if !names[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return spans
		}
		if time.Now().After(deadline) {
			var got []string
			for n := range names {
				got = append(got, n)
			}
			t.Fatalf("trace %s lacks %v; it has %v", traceID, missing, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOneTraceFromHTTPToBackend: a chat request is one trace, continued
// from the client's traceparent, holding the HTTP server span, the
// workflow's start and run, every activity, the LLM backend call with its
// GenAI attributes and the Redis scripts; the done event names it. The
// request's one log line has every field, the trace id among them, and
// neither the question, the answer nor the key.
func TestOneTraceFromHTTPToBackend(t *testing.T) {
	ts := startTracedStack(t)
	clientTrace, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	const query = "How does a token bucket refill its tokens?"
	done, answer := ts.ask(t, query, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if done.TraceID != clientTrace.String() {
		t.Fatalf("done event trace id %q, want the client's %s", done.TraceID, clientTrace)
	}
	model := stack.cfg.Pools.Short.Model
	spans := ts.waitForSpans(t, clientTrace, []string{
		"POST /v1/chat", "StartWorkflow:ChatWorkflow", "RunWorkflow:ChatWorkflow",
		"RunActivity:EmbedQuery", "RunActivity:Admit", "RunActivity:Retrieve", "RunActivity:Rerank",
		"RunActivity:StreamLLM", "RunActivity:Finalize", "chat " + model,
	})
	var scripts, llmCalls int
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
		switch {
		case s.Name == "POST /v1/chat":
			if s.SpanKind != trace.SpanKindServer || s.Parent.SpanID().String() != "00f067aa0ba902b7" {
				t.Errorf("HTTP span kind %s parent %s: want a server span under the client's", s.SpanKind, s.Parent.SpanID())
			}
			// The client's address (127.0.0.1 here) only as its keyed
			// hash; server.address is Sluice's own.
			addrs := 0
			for _, a := range s.Attributes {
				if a.Key == "client.address" || a.Key == "network.peer.address" {
					addrs++
					if !iphash.IsHash(a.Value.String()) {
						t.Errorf("%s=%q: want the address's keyed hash", a.Key, a.Value.String())
					}
				}
			}
			if addrs == 0 {
				t.Error("the HTTP span has no client.address or network.peer.address")
			}
		case s.Name == "evalsha" || s.Name == "eval":
			scripts++
		case s.Name == "chat "+model:
			llmCalls++
			checkGenAISpan(t, s, model)
		}
	}
	t.Logf("trace %s: %d spans %v", clientTrace, len(spans), names)
	if scripts == 0 {
		t.Error("no Redis script span in the trace")
	}
	if llmCalls != 1 {
		t.Errorf("%d LLM call spans, want 1", llmCalls)
	}
	checkLogLine(t, ts.log, done, query, answer)
}

func checkGenAISpan(t *testing.T, s tracetest.SpanStub, model string) {
	t.Helper()
	if s.SpanKind != trace.SpanKindClient {
		t.Errorf("LLM span kind %s, want client", s.SpanKind)
	}
	attrs := map[string]any{}
	for _, kv := range s.Attributes {
		attrs[string(kv.Key)] = kv.Value.AsInterface()
	}
	if attrs["gen_ai.operation.name"] != "chat" || attrs["gen_ai.request.model"] != model {
		t.Errorf("LLM span attributes %v", attrs)
	}
	for _, k := range []string{"gen_ai.response.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "sluice.llm.time_to_first_token_ms"} {
		if _, ok := attrs[k]; !ok {
			t.Errorf("LLM span lacks %s: %v", k, attrs)
		}
	}
}

// checkLogLine finds the request's "request finished" line and checks it.
func checkLogLine(t *testing.T, log *testenv.SyncBuffer, done events.Done, query, answer string) {
	t.Helper()
	var line map[string]any
	var raw string
	deadline := time.Now().Add(10 * time.Second)
	for line == nil && time.Now().Before(deadline) {
		for _, l := range strings.Split(log.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == request.FinishedMessage && m["requestID"] == done.RequestID {
				if line != nil {
					t.Fatalf("two lines for %s", done.RequestID)
				}
				line, raw = m, l
			}
		}
		if line == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if line == nil {
		t.Fatalf("no request line for %s in:\n%s", done.RequestID, log.String())
	}
	want := map[string]any{
		"tenant": "acme", "route": done.Route, "outcome": "done", "reason": "", "trace_id": done.TraceID,
		"prompt_tokens": float64(done.Usage.PromptTokens), "completion_tokens": float64(done.Usage.CompletionTokens),
		"service_tier": done.ServiceTier,
	}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("%s = %v, want %v", k, line[k], v)
		}
	}
	for _, k := range []string{"embed_ms", "queue_wait_ms", "retrieval_ms", "rerank_ms", "llm_first_token_ms", "llm_ms", "ttft_ms", "cached"} {
		if _, ok := line[k]; !ok {
			t.Errorf("the line lacks %s: %s", k, raw)
		}
	}
	if len(answer) < 20 {
		t.Fatalf("answer %q too short to look for", answer)
	}
	for _, secret := range []string{query, "token bucket", "k-acme", answer, strings.TrimSpace(answer[:20])} {
		if strings.Contains(raw, secret) {
			t.Errorf("the line holds %q: %s", secret, raw)
		}
	}
	// No field beyond these, which hold no text of the request's.
	known := map[string]bool{"time": true, "level": true, "msg": true, "requestID": true, "component": true, "answer_cache_ms": true}
	for k := range want {
		known[k] = true
	}
	for _, k := range []string{"embed_ms", "queue_wait_ms", "retrieval_ms", "rerank_ms", "llm_first_token_ms", "llm_ms", "ttft_ms", "cached"} {
		known[k] = true
	}
	for k := range line {
		if !known[k] {
			t.Errorf("unexpected field %s on the line: %s", k, raw)
		}
	}
}
