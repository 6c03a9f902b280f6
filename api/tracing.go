package api

import (
	"net"
	"net/http"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/pkg/tracing"
)

// untraced are the paths probes and scrapers call every few seconds: a
// trace each would bury the requests'.
var untraced = map[string]bool{"/metrics": true, "/healthz": true, "/readyz": true}

// traced wraps h in an HTTP server span per request, continuing the trace
// of a client's traceparent header; h itself when tp is nil (tracing off).
// The span lasts as long as the response: a chat's covers its whole
// event stream.
func traced(h http.Handler, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		return h
	}
	return otelhttp.NewHandler(h, "http.server",
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(tracing.Propagator()),
		// Tracing only: HTTP metrics are Sluice's own (pkg/metrics).
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelhttp.WithFilter(func(r *http.Request) bool { return !untraced[r.URL.Path] }),
	)
}

// nameSpan names the request's server span after the route Echo matched
// ("POST /v1/chat", not the path with its ids), once Echo has routed it,
// and replaces the client addresses otelhttp records with their keyed
// hash: traces leave the process, and nothing stored may name a client's
// address (the same hash as its rate-limit keys and bans).
func (s *Server) nameSpan(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if span := trace.SpanFromContext(c.Request().Context()); span.IsRecording() {
			if c.Path() != "" {
				span.SetName(c.Request().Method + " " + c.Path())
				span.SetAttributes(semconv.HTTPRoute(c.Path()))
			}
			span.SetAttributes(
				attribute.String(string(semconv.ClientAddressKey), s.addresses.ClientOf(c.RealIP())),
				attribute.String(string(semconv.NetworkPeerAddressKey), s.addresses.Of(peerHost(c.Request().RemoteAddr))),
			)
		}
		return next(c)
	}
}

// peerHost is the host of a connection's remote address.
func peerHost(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}
