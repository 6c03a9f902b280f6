// Package metrics is Sluice's Prometheus instrumentation: per-stage latency
// histograms, request outcomes, rate-limit decisions, queue depth and
// permits per pool, cache tiers, the LLM backends' circuit breakers, and
// the Temporal SDK's own metrics. Labels
// never name a tenant or a user: their number is unbounded, and a per-tenant
// view belongs in logs and the Temporal UI's search attributes.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// OutcomeRejectedRate labels a request the rate limits refused at the
// door; every other outcome label is OutcomeOf a request's outcome and
// reason (pkg/request).
const OutcomeRejectedRate = request.OutcomeRejected + "_rate"

// Metrics holds Sluice's collectors in a registry of its own (no global
// state: two servers in one test process do not collide). Methods on a
// nil *Metrics do nothing, so code that may run without metrics needs no
// checks.
type Metrics struct {
	reg *prometheus.Registry

	stages       *prometheus.HistogramVec
	requests     *prometheus.CounterVec
	rateLimits   *prometheus.CounterVec
	alerts       *prometheus.CounterVec
	bans         *prometheus.CounterVec
	banned       *prometheus.CounterVec
	logger       *slog.Logger
	scrapeBudget time.Duration
}

// stageBuckets span a cache hit (sub-millisecond) to a long answer
// (minutes), about two per factor of 2.5.
var stageBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 25, 60, 150, 300}

// New returns Metrics with Go runtime and process collectors registered.
func New(logger *slog.Logger) *Metrics {
	if logger == nil {
		logger = slog.Default()
	}
	m := &Metrics{
		reg:    prometheus.NewRegistry(),
		logger: logger,
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_stage_duration_seconds",
			Help:    "Time a request spent in each stage (embed, answer_cache, admission, retrieval, rerank, llm_first_token, llm), by pool, cache tier and the request's outcome.",
			Buckets: stageBuckets,
		}, []string{"stage", "pool", "cache", "outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_total",
			Help: "Chat requests by how they ended (done, rejected_rate, rejected_queue_timeout, rejected_queue_full, rejected_tenant_queue_full, rejected_busy, cancelled, failed) and route.",
		}, []string{"outcome", "route"}),
		rateLimits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ratelimit_decisions_total",
			Help: "Rate-limit decisions at the door, by the dimension that decided (tenant, user, ip; all when every bucket allowed) and the decision.",
		}, []string{"dimension", "decision"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_healing_alerts_total",
			Help: "Alerts the tail-latency healer raised, by pool and level (warn, critical).",
		}, []string{"pool", "level"}),
		bans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_bans_total",
			Help: "Abuse bans imposed by this instance, by what they name (ip, key).",
		}, []string{"kind"}),
		banned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_banned_requests_total",
			Help: "Requests refused (429) because their IP or key was banned, by what was banned (ip, key).",
		}, []string{"kind"}),
		scrapeBudget: 2 * time.Second,
	}
	m.reg.MustRegister(m.stages, m.requests, m.rateLimits, m.alerts, m.bans, m.banned,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is where more collectors go.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, ErrorLog: slogPrinter{m.logger}})
}

// Request is what a finished request reports.
type Request struct {
	// Route is the pool, "cache" for an answer-cache hit, or empty when
	// the request ended before routing.
	Route string
	// Outcome is an Outcome* label (see OutcomeOf).
	Outcome string
	Timings []events.StageTiming
}

// ObserveRequest counts a finished request and observes its stages.
func (m *Metrics) ObserveRequest(r Request) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(r.Outcome, r.Route).Inc()
	for _, t := range r.Timings {
		m.stages.WithLabelValues(t.Stage, r.Route, t.Cache, r.Outcome).Observe(float64(t.Ms) / 1000)
	}
}

// Refused counts a request refused at the door (its outcome label says
// why), before any workflow ran.
func (m *Metrics) Refused(outcome string) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(outcome, "").Inc()
}

// RateLimit counts one rate-limit decision.
func (m *Metrics) RateLimit(dimension string, allowed bool) {
	if m == nil {
		return
	}
	decision := "deny"
	if allowed {
		decision = "allow"
	}
	m.rateLimits.WithLabelValues(dimension, decision).Inc()
}

// Banned counts a request refused for a ban of kind (ip, key); imposed
// says that this request's count imposed it. The label never names the
// address or the key: their number is unbounded, and logs name them.
func (m *Metrics) Banned(kind string, imposed bool) {
	if m == nil {
		return
	}
	if imposed {
		m.bans.WithLabelValues(kind).Inc()
	}
	m.banned.WithLabelValues(kind).Inc()
}

// HealingAlert counts an alert of the healer about pool at level.
func (m *Metrics) HealingAlert(pool, level string) {
	if m == nil {
		return
	}
	m.alerts.WithLabelValues(pool, level).Inc()
}

// OutcomeOf names a workflow outcome and reason as the requests counter
// labels it: a rejection carries its reason (rejected_queue_timeout).
func OutcomeOf(outcome, reason string) string {
	if outcome == request.OutcomeRejected && reason != "" {
		return request.OutcomeRejected + "_" + reason
	}
	return outcome
}

// PoolStats is what a pool reports at scrape time.
type PoolStats struct {
	InUse, Limit, Waiting int
}

// RegisterPools exposes each pool's permits and queue, read when scraped
// (bounded by a short timeout, so a slow Redis makes a scrape miss the
// gauges, not hang).
func (m *Metrics) RegisterPools(pools []string, stats func(ctx context.Context, pool string) (PoolStats, error)) {
	if m == nil {
		return
	}
	m.reg.MustRegister(&poolCollector{pools: pools, stats: stats, budget: m.scrapeBudget, logger: m.logger})
}

var (
	inUseDesc   = prometheus.NewDesc("sluice_pool_permits_in_use", "LLM permits held, per pool.", []string{"pool"}, nil)
	limitDesc   = prometheus.NewDesc("sluice_pool_permits_limit", "LLM permits a pool has, per pool.", []string{"pool"}, nil)
	waitingDesc = prometheus.NewDesc("sluice_pool_queue_depth", "Requests waiting for a permit, per pool.", []string{"pool"}, nil)
)

type poolCollector struct {
	pools  []string
	stats  func(ctx context.Context, pool string) (PoolStats, error)
	budget time.Duration
	logger *slog.Logger
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inUseDesc
	ch <- limitDesc
	ch <- waitingDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.budget)
	defer cancel()
	for _, pool := range c.pools {
		st, err := c.stats(ctx, pool)
		if err != nil {
			c.logger.Warn("metrics: read pool stats", "pool", pool, "err", err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(inUseDesc, prometheus.GaugeValue, float64(st.InUse), pool)
		ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(st.Limit), pool)
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(st.Waiting), pool)
	}
}

// CacheStats is one cache tier's counters.
type CacheStats struct {
	Hits, Misses, Bytes uint64
}

// RegisterCache exposes a cache tier's counters (tier: embedding, retrieval,
// answer), read from stats when scraped.
func (m *Metrics) RegisterCache(tier string, stats func() CacheStats) {
	if m == nil {
		return
	}
	labels := prometheus.Labels{"tier": tier}
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_cache_hits_total", Help: "Cache lookups answered, per tier.", ConstLabels: labels},
			func() float64 { return float64(stats().Hits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_cache_misses_total", Help: "Cache lookups not answered, per tier.", ConstLabels: labels},
			func() float64 { return float64(stats().Misses) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_cache_served_bytes_total", Help: "Bytes of cached values served, per tier.", ConstLabels: labels},
			func() float64 { return float64(stats().Bytes) }),
	)
}

// Circuit is one backend endpoint's circuit breaker as a scrape sees it.
type Circuit struct {
	Pool, Endpoint string
	// State is 0 closed, 1 half-open, 2 open.
	State int
}

var circuitDesc = prometheus.NewDesc("sluice_backend_circuit_state",
	"Circuit breaker of each LLM backend endpoint: 0 closed, 1 half-open (probing), 2 open (skipped).", []string{"pool", "endpoint"}, nil)

// RegisterBackends exposes each backend endpoint's circuit, read from
// circuits when scraped.
func (m *Metrics) RegisterBackends(circuits func() []Circuit) {
	if m == nil {
		return
	}
	m.reg.MustRegister(circuitCollector(circuits))
}

type circuitCollector func() []Circuit

func (c circuitCollector) Describe(ch chan<- *prometheus.Desc) { ch <- circuitDesc }

func (c circuitCollector) Collect(ch chan<- prometheus.Metric) {
	for _, ci := range c() {
		ch <- prometheus.MustNewConstMetric(circuitDesc, prometheus.GaugeValue, float64(ci.State), ci.Pool, ci.Endpoint)
	}
}

type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.l.Warn("metrics: serve", "err", v) }
