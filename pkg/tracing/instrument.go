package tracing

import (
	"context"
	"fmt"
	"net/http"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
)

// ChildrenOnly wraps tp so that its tracers start spans only under a
// parent span. Redis and Temporal calls are also made by the process's
// background machinery (the event hub's blocking reads, the admission
// janitor, the latency flusher, the healer): traced on their own they
// would be a stream of one-span traces nobody asked for. A request's own
// calls carry its span and are traced as its children.
func ChildrenOnly(tp trace.TracerProvider) trace.TracerProvider {
	return childrenOnly{tp}
}

type childrenOnly struct{ trace.TracerProvider }

func (p childrenOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childTracer{p.TracerProvider.Tracer(name, opts...)}
}

type childTracer struct{ trace.Tracer }

func (t childTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		// The span of a context without one: a no-op that records nothing.
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.Tracer.Start(ctx, name, opts...)
}

// InstrumentRedis makes every Redis command, pipeline and script call
// made under a request's span a child span of it (tracing only; Sluice's
// Redis metrics are its own). The span carries the command's name, never
// its arguments: keys and values hold prompts, answers and key hashes.
func InstrumentRedis(rdb redis.UniversalClient, tp trace.TracerProvider) error {
	err := redisotel.InstrumentTracing(rdb,
		redisotel.WithTracerProvider(ChildrenOnly(tp)),
		redisotel.WithDBStatement(false),
		// The caller's file and line cost a stack walk per command.
		redisotel.WithCallerEnabled(false),
	)
	if err != nil {
		return fmt.Errorf("trace redis commands: %w", err)
	}
	return nil
}

// TemporalInterceptor traces workflow starts, signals and queries on the
// client, and each workflow run and activity (local ones too) on the
// worker, carrying the trace in Temporal headers: set on the client, it
// serves the workers built from that client as well. Workflows started
// without a span (the healer) are not traced.
func TemporalInterceptor(tp trace.TracerProvider) (interceptor.Interceptor, error) {
	i, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{
		Tracer:            ChildrenOnly(tp).Tracer("go.temporal.io/sdk"),
		TextMapPropagator: Propagator(),
	})
	if err != nil {
		return nil, fmt.Errorf("trace temporal calls: %w", err)
	}
	return i, nil
}

// Untraced is ctx with its span hidden from the ChildrenOnly tracers (Redis
// and Temporal calls), for calls made once per streamed token: traced,
// a 300-token answer would add some 900 Redis spans to its trace. The
// LLM call's span counts the tokens instead.
func Untraced(ctx context.Context) context.Context {
	return trace.ContextWithSpanContext(ctx, trace.SpanContext{})
}

// HTTPClient is an HTTP client whose requests are client spans named
// name, with attrs, under the caller's span (never a trace of their own),
// for the model servers Sluice calls besides the LLM (a remote embedder,
// a reranker). nil when tp is nil: tracing is off, and the caller's
// default client is used.
func HTTPClient(tp trace.TracerProvider, name string, attrs ...attribute.KeyValue) *http.Client {
	if tp == nil {
		return nil
	}
	return &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport,
		otelhttp.WithTracerProvider(ChildrenOnly(tp)),
		otelhttp.WithPropagators(Propagator()),
		// Tracing only: the calls' times are Sluice's stage metrics.
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelhttp.WithSpanNameFormatter(func(string, *http.Request) string { return name }),
		otelhttp.WithSpanOptions(trace.WithAttributes(attrs...)),
	)}
}
