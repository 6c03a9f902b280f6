package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// failoverMetrics count streams moved to another endpoint mid-answer, by
// how the move went, and the wait each successful one cost the client.
type failoverMetrics struct {
	total *prometheus.CounterVec
	gap   *prometheus.HistogramVec
}

// failoverBuckets span a broken connection noticed at once (a few
// milliseconds to reach another endpoint and prefill the prefix) to a
// stall noticed only when the token-idle deadline passes (seconds).
var failoverBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newFailoverMetrics() failoverMetrics {
	return failoverMetrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_stream_failovers_total",
			Help: "Streams that broke mid-answer and were handed to another endpoint of the pool, by pool and outcome (resumed: the other endpoint continued the answer; failed: it failed first; no_endpoint: none had its circuit closed).",
		}, []string{"pool", "outcome"}),
		gap: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_stream_failover_gap_seconds",
			Help:    "The client's wait in a resumed failover: from the last token before the endpoint failed to the continuation's first, by pool.",
			Buckets: failoverBuckets,
		}, []string{"pool"}),
	}
}

func (f failoverMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{f.total, f.gap}
}

// StreamFailover counts one failover of a pool's stream; gap is the
// client's wait when it resumed.
func (m *Metrics) StreamFailover(pool, outcome string, gap time.Duration) {
	if m == nil {
		return
	}
	m.failovers.total.WithLabelValues(pool, outcome).Inc()
	if outcome == "resumed" {
		m.failovers.gap.WithLabelValues(pool).Observe(gap.Seconds())
	}
}
