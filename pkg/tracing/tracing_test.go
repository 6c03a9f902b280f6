package tracing

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// clearEnv unsets every variable that turns tracing on, for this test.
func clearEnv(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_TRACES_SAMPLER"} {
		t.Setenv(k, "")
	}
	t.Cleanup(func() { Install(nil) })
}

func TestOffUnlessAnExporterIsConfigured(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		on   bool
	}{
		{"nothing set", nil, false},
		{"service name alone", map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
		{"exporter none with an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, false},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
		{"endpoint alone", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, true},
		{"traces endpoint alone", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, true},
		{"exporter named", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			if got := Configured(); got != c.on {
				t.Fatalf("Configured() = %t, want %t", got, c.on)
			}
			stop, err := Start(context.Background(), "sluice-test", slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = stop(context.Background()) }()
			if on := Provider() != nil; on != c.on {
				t.Fatalf("provider installed = %t, want %t", on, c.on)
			}
		})
	}
}

func TestBadExporterNameFailsStart(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin-please")
	if _, err := Start(context.Background(), "sluice-test", slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("an unknown OTEL_TRACES_EXPORTER started")
	}
}

// receiver is an OTLP/HTTP trace receiver: it keeps what is posted to
// /v1/traces.
type receiver struct {
	mu   sync.Mutex
	reqs []*collectortrace.ExportTraceServiceRequest
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, &req)
	rc.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// TestOTLPHTTPConfiguredByEnvOnly: the two variables an operator sets
// (and the service name) deliver the process's spans to a collector over
// OTLP/HTTP, with the trace id the process saw.
func TestOTLPHTTPConfiguredByEnvOnly(t *testing.T) {
	clearEnv(t)
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "sluice-env-test")
	ctx := context.Background()
	stop, err := Start(ctx, "sluice-api", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	tp := Provider()
	if tp == nil {
		t.Fatal("no provider installed")
	}
	sctx, span := tp.Tracer("test").Start(ctx, "unit-of-work")
	want := TraceID(sctx)
	span.End()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := stop(sctx); err != nil {
		t.Fatalf("flush to the receiver: %v", err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var found bool
	for _, req := range rc.reqs {
		for _, rs := range req.ResourceSpans {
			service := ""
			for _, kv := range rs.Resource.Attributes {
				if kv.Key == "service.name" {
					service = kv.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					if s.Name != "unit-of-work" {
						continue
					}
					found = true
					if got := trace.TraceID(s.TraceId).String(); got != want {
						t.Errorf("trace id %s, want %s", got, want)
					}
					if service != "sluice-env-test" {
						t.Errorf("service.name %q, want OTEL_SERVICE_NAME's sluice-env-test", service)
					}
				}
			}
		}
	}
	if !found {
		t.Fatalf("the receiver got %d export requests, none with the span", len(rc.reqs))
	}
}

func TestChildrenOnlyTracesOnlyUnderAParent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := ChildrenOnly(tp).Tracer("test")
	_, orphan := tr.Start(context.Background(), "orphan")
	orphan.End()
	pctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
	_, child := tr.Start(pctx, "child")
	child.End()
	parent.End()
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
		if s.Name() == "child" && s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("child's parent is %s, want %s", s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
	}
	if len(names) != 2 || names[0] != "child" || names[1] != "parent" {
		t.Fatalf("recorded %v, want [child parent]", names)
	}
}

// TestRedisScriptsAreChildSpansWithoutArguments: a script run under a
// span is its child, named by its command; the span holds neither keys
// nor arguments; a command outside any span is not traced.
func TestRedisScriptsAreChildSpansWithoutArguments(t *testing.T) {
	rds := testenv.StartRedis(t)
	rdb := rds.Client(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	if err := InstrumentRedis(rdb, tp); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rdb.Set(ctx, "background", "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rctx, root := tp.Tracer("test").Start(ctx, "request")
	script := redis.NewScript(`return redis.call("SET", KEYS[1], ARGV[1])`)
	if err := script.Run(rctx, rdb, []string{"secret-key"}, "secret-answer-text").Err(); err != nil {
		t.Fatal(err)
	}
	root.End()
	var script0 bool
	for _, s := range rec.Ended() {
		if s.Name() == "request" {
			continue
		}
		if s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("span %s is not the request's child", s.Name())
		}
		if s.Name() == "evalsha" || s.Name() == "eval" {
			script0 = true
		}
		for _, kv := range s.Attributes() {
			v := kv.Value.String()
			if strings.Contains(v, "secret-key") || strings.Contains(v, "secret-answer-text") {
				t.Errorf("span %s attribute %s holds the command's arguments: %q", s.Name(), kv.Key, v)
			}
		}
		if s.Name() == "set" {
			t.Errorf("the command outside any span was traced")
		}
	}
	if !script0 {
		t.Fatalf("no script span among %d spans", len(rec.Ended()))
	}
}

// A remote model's calls are client spans under the request's span, named
// and described as asked, carrying the trace to the server; outside a
// request (a seeding job) they make no trace; off, there is no client.
func TestHTTPClientSpansModelCalls(t *testing.T) {
	if HTTPClient(nil, "embeddings m") != nil {
		t.Fatal("tracing off: want no client (the caller's default)")
	}
	var gotParent string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotParent = r.Header.Get("traceparent")
	}))
	defer srv.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	hc := HTTPClient(tp, "embeddings text-embedding-3-small", attribute.String("gen_ai.operation.name", "embeddings"))

	get := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	get(context.Background())
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("a call outside any request made %d spans", n)
	}
	ctx, parent := tp.Tracer("test").Start(context.Background(), "RunActivity:EmbedQuery")
	get(ctx)
	parent.End()
	var call sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "embeddings text-embedding-3-small" {
			call = s
		}
	}
	if call == nil {
		t.Fatalf("no span for the call: %d spans", len(rec.Ended()))
	}
	if call.Parent().SpanID() != parent.SpanContext().SpanID() || call.SpanKind().String() != "client" {
		t.Errorf("call span parent %s kind %s: want a client span under the activity's", call.Parent().SpanID(), call.SpanKind())
	}
	found := false
	for _, a := range call.Attributes() {
		found = found || (a.Key == "gen_ai.operation.name" && a.Value.AsString() == "embeddings")
	}
	if !found {
		t.Errorf("attributes %v: want gen_ai.operation.name=embeddings", call.Attributes())
	}
	if !strings.Contains(gotParent, call.SpanContext().TraceID().String()) {
		t.Errorf("server got traceparent %q, want trace %s", gotParent, call.SpanContext().TraceID())
	}
}
