package llm

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/pkg/openai"
)

func tracedClient(t *testing.T, endpoint string) (*OpenAI, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	c, err := NewOpenAI(OpenAIOptions{Name: "short", Endpoints: []string{endpoint},
		Tracer: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))})
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestCompletionIsAGenAIClientSpan: one completion is one client span
// named "chat <model>" with the GenAI attributes, the first token as an
// event and TTFT as an attribute, and neither prompt nor answer text.
func TestCompletionIsAGenAIClientSpan(t *testing.T) {
	srv := sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range []string{"secret", " answer"} {
			fmt.Fprintf(w, `data: {"model":"m-2024","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`+"\n\n", tok)
		}
		fmt.Fprint(w, `data: {"model":"m-2024","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, `data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	c, rec := tracedClient(t, srv.URL)
	parentTP := sdktrace.NewTracerProvider()
	ctx, parent := parentTP.Tracer("test").Start(context.Background(), "activity")
	_, err := c.Stream(ctx, Request{Model: "m", MaxTokens: 50, Messages: []openai.Message{openai.TextMessage("user", "secret prompt")}},
		func(Delta) error { return nil })
	parent.End()
	if err != nil {
		t.Fatal(err)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Name() != "chat m" || s.SpanKind() != trace.SpanKindClient {
		t.Errorf("span %q kind %s, want chat m, client", s.Name(), s.SpanKind())
	}
	if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Error("the completion's span is not the caller's child")
	}
	a := attrsOf(s)
	want := map[attribute.Key]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
		"gen_ai.request.model": "m", "gen_ai.response.model": "m-2024",
		"gen_ai.usage.input_tokens": int64(11), "gen_ai.usage.output_tokens": int64(2),
		"gen_ai.request.max_tokens": int64(50), "sluice.pool": "short", "server.address": "127.0.0.1",
	}
	for k, v := range want {
		if got := a[k].AsInterface(); got != v {
			t.Errorf("%s = %v, want %v", k, got, v)
		}
	}
	if got := a["gen_ai.response.finish_reasons"].AsStringSlice(); len(got) != 1 || got[0] != "stop" {
		t.Errorf("finish reasons %v", got)
	}
	if _, ok := a[attrTTFT]; !ok {
		t.Error("no time to first token")
	}
	if ev := s.Events(); len(ev) != 1 || ev[0].Name != "gen_ai.first_token" {
		t.Errorf("events %v, want one gen_ai.first_token", ev)
	}
	for k, v := range a {
		if strings.Contains(v.String(), "secret") {
			t.Errorf("attribute %s holds message text: %q", k, v.String())
		}
	}
}

func TestFailedCompletionSpanHasErrorType(t *testing.T) {
	srv := sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) {
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
	})
	c, rec := tracedClient(t, srv.URL)
	if _, err := c.Stream(context.Background(), Request{Model: "m"}, func(Delta) error { return nil }); err == nil {
		t.Fatal("no error")
	}
	s := rec.Ended()[0]
	if s.Status().Code != codes.Error || attrsOf(s)["error.type"].AsString() != "503" {
		t.Fatalf("status %v, error.type %q", s.Status(), attrsOf(s)["error.type"].AsString())
	}
}
