package metrics

import (
	"go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.temporal.io/sdk/client"
	otelsdk "go.temporal.io/sdk/contrib/opentelemetry"
)

// TemporalSeries are the Temporal SDK series that Sluice's dashboard and
// alert rules read, as Prometheus names them. They are the names
// Temporal's own SDK dashboards and worker-health guide use:
// counters end in _total, timers are histograms in seconds. A test
// against a real Temporal server (tests/integration) checks that a worker
// run exposes each; series that only a fault produces (long-poll
// failures, sticky cache misses) are left out, since that run cannot
// show them.
var TemporalSeries = []string{
	"temporal_request_total",
	"temporal_request_failure_total",
	"temporal_long_request_total",
	"temporal_num_pollers",
	"temporal_worker_task_slots_available",
	"temporal_worker_task_slots_used",
	"temporal_sticky_cache_size",
	"temporal_sticky_cache_hit_total",
	"temporal_workflow_task_schedule_to_start_latency_seconds_bucket",
	"temporal_workflow_task_execution_latency_seconds_bucket",
	"temporal_activity_schedule_to_start_latency_seconds_bucket",
	"temporal_activity_execution_latency_seconds_bucket",
}

// TemporalHandler exports the Temporal SDK's metrics into the registry
// through the SDK's own OpenTelemetry contrib and OpenTelemetry's
// Prometheus exporter, so that they carry Temporal's names and tags
// (namespace, task_queue, workflow_type, activity_type, worker_type,
// poller_type, operation): dashboards and alerts written for Temporal work
// on them unchanged. Each Metrics has a meter provider of its own, like
// its registry.
func (m *Metrics) TemporalHandler() client.MetricsHandler {
	if m == nil {
		return client.MetricsNopHandler
	}
	exp, err := prometheus.New(
		prometheus.WithRegisterer(m.reg),
		// One scrape target is one process: the scope and target_info
		// series would only repeat that on every line.
		prometheus.WithoutScopeInfo(),
		prometheus.WithoutTargetInfo(),
	)
	if err != nil {
		// Registering twice in one registry is the only way this fails:
		// run without SDK metrics rather than without a worker.
		m.logger.Error("metrics: export Temporal SDK metrics", "err", err)
		return client.MetricsNopHandler
	}
	// OpenTelemetry's default buckets are for milliseconds; the SDK's
	// timers are seconds, from a sticky-cache hit to a minutes-long stream.
	seconds := sdkmetric.NewView(
		sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Unit: "s"},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: stageBuckets}},
	)
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithView(seconds))
	logger := m.logger
	return otelsdk.NewMetricsHandler(otelsdk.MetricsHandlerOptions{
		Meter: provider.Meter("temporal-sdk-go"),
		// Counters as monotonic sums: Prometheus counters with _total,
		// which rate() and Temporal's dashboards expect.
		UseMonotonicCounters: true,
		// The default panics: a metric the SDK cannot record must not
		// take a worker down.
		OnError: func(err error) { logger.Warn("metrics: Temporal SDK metric", "err", err) },
	})
}
