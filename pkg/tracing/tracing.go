// Package tracing sets up OpenTelemetry tracing for a Sluice process from
// the standard OTEL_* environment variables and instruments what a request
// passes through: the HTTP server, the Temporal client and worker, and
// Redis. It is off unless an exporter is configured: then no provider is
// installed, nothing is instrumented, and a request costs no tracing work.
package tracing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// installed is the process's tracer provider; nil while tracing is off.
var installed atomic.Pointer[trace.TracerProvider]

// Install makes tp the provider that the wiring built afterwards traces
// with; nil turns tracing off for what is built afterwards. Start installs
// the provider it builds; tests and programs that embed Sluice install
// their own (an in-memory exporter's, say).
func Install(tp trace.TracerProvider) {
	if tp == nil {
		installed.Store(nil)
		return
	}
	installed.Store(&tp)
}

// Provider is the installed tracer provider, nil when tracing is off. The
// wiring reads it once, when it builds a process's clients and server.
func Provider() trace.TracerProvider {
	if p := installed.Load(); p != nil {
		return *p
	}
	return nil
}

// Propagator is how trace context crosses processes: W3C traceparent and
// baggage, so that a client's traceparent header continues its trace.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// TraceID is the id of the trace ctx's span belongs to, in hex; "" when
// ctx carries no span (tracing off).
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// Configured reports whether the environment asks for traces: an
// exporter named in OTEL_TRACES_EXPORTER other than "none", or an OTLP
// endpoint (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
// with no exporter named, and OTEL_SDK_DISABLED not "true". The SDK's own
// default exporter is OTLP to localhost, which would make every process
// try to send spans nobody asked for; Sluice's default is none.
func Configured() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	if exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp != "" {
		return exp != "none"
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Start builds the process's tracer provider from the OTEL_* environment
// (exporter, endpoint, protocol, headers, sampler, resource attributes),
// installs it, and returns what flushes and stops it at exit. service is
// the service.name unless OTEL_SERVICE_NAME says otherwise. When the
// environment asks for no traces, nothing is installed and stop does
// nothing.
func Start(ctx context.Context, service string, logger *slog.Logger) (stop func(context.Context) error, err error) {
	none := func(context.Context) error { return nil }
	if !Configured() {
		return none, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: build the span exporter from OTEL_TRACES_EXPORTER and OTEL_EXPORTER_OTLP_*: %w", err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return none, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		// Later detectors win: OTEL_SERVICE_NAME and
		// OTEL_RESOURCE_ATTRIBUTES override the default name.
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: describe the process (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %w", err)
	}
	// The sampler comes from OTEL_TRACES_SAMPLER and _ARG (default
	// parentbased_always_on: a client's unsampled traceparent is honoured).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	// Export failures (a collector down) are logged, not printed with the
	// standard library's logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing", "err", err)
	}))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(Propagator())
	Install(tp)
	logger.Info("tracing on", "service", service, "exporter", cmp.Or(os.Getenv("OTEL_TRACES_EXPORTER"), "otlp"))
	return tp.Shutdown, nil
}
