// Package metrics is Sluice's Prometheus instrumentation: per-stage latency
// histograms, request outcomes, rate-limit decisions, queue depth and
// permits per pool and their utilisation, cache tiers, the LLM backends' circuit breakers, and
// the Temporal SDK's own metrics, tokens, queue waits, the healer's
// levels and actions, whether Redis and Temporal answer, and the build
// (sluice_build_info). Labels never name a user, and name a tenant only
// in the per-tenant service and backlog series (tenants.go), which hold a
// bounded number of tenants and stay off the public port; any other
// per-tenant view belongs in logs and the Temporal UI's search attributes.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/version"
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
	queueWait    *prometheus.HistogramVec
	ttft         *prometheus.HistogramVec
	tokens       *prometheus.CounterVec
	healing      *healingLevels
	deps         *dependencyCollector
	depsOnce     sync.Once
	actions      *prometheus.CounterVec
	rateLimits   *prometheus.CounterVec
	alerts       *prometheus.CounterVec
	bans         *prometheus.CounterVec
	banned       *prometheus.CounterVec
	connsRefused *prometheus.CounterVec
	usageWrites  *prometheus.CounterVec
	budgetWarns  *prometheus.CounterVec
	// budgetOverTokens and budgetOverUSD are what requests used beyond
	// their budget reservations.
	budgetOverTokens *prometheus.CounterVec
	budgetOverUSD    *prometheus.CounterVec
	permits          permitCounters
	failovers        failoverMetrics
	// tenants is nil unless TrackTenants turned the per-tenant series on.
	tenants      *tenants
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
			Help: "Chat requests by how they ended (done, rejected_rate, rejected_queue_timeout, rejected_queue_full, rejected_tenant_queue_full, rejected_busy, rejected_budget_exceeded, cancelled, failed) and route.",
		}, []string{"outcome", "route"}),
		rateLimits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ratelimit_decisions_total",
			Help: "Rate-limit decisions at the door, by the dimension that decided (tenant, user, ip; all when every bucket allowed) and the decision.",
		}, []string{"dimension", "decision"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_healing_alerts_total",
			Help: "Alerts the tail-latency healer raised, by pool and level (warn, critical).",
		}, []string{"pool", "level"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_admission_wait_seconds",
			Help:    "Time a request waited for an LLM permit (0 when one was free), by pool and the caller's tier.",
			Buckets: stageBuckets,
		}, []string{"pool", "tier"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_ttft_seconds",
			Help:    "Time from the request's start to its first LLM token, every stage before it included (the admission wait too), by pool and tier.",
			Buckets: stageBuckets,
		}, []string{"pool", "tier"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_llm_tokens_total",
			Help: "Tokens of finished LLM calls, by pool, tier and kind (prompt, completion); the backend's usage when it sent one, streamed chunks otherwise.",
		}, []string{"pool", "tier", "kind"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_healing_actions_total",
			Help: "Actions the healer applied through this instance, by pool and action (set_permits, set_batch, throttle_long, scale, shed).",
		}, []string{"pool", "action"}),
		bans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_bans_total",
			Help: "Abuse bans imposed by this instance, by what they name (ip, key).",
		}, []string{"kind"}),
		banned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_banned_requests_total",
			Help: "Requests refused (429) because their IP or key was banned, by what was banned (ip, key).",
		}, []string{"kind"}),
		connsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_api_connections_refused_total",
			Help: "Connections the API refused at accept, by the cap they were beyond (api.max_conns, api.max_conns_per_ip, api.proxy_conns_share; api.max_conns_per_ip also counts requests of a client behind a trusted proxy with that many in flight) and whether they were answered (429 or 503 with Retry-After; false: closed unanswered, the client sent nothing or too many refusals were being answered).",
		}, []string{"limit", "answered"}),
		usageWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_usage_records_total",
			Help: "Writes of finished requests to the usage ledger, by result: inserted, duplicate (a retry found the request recorded) or failed (retried by its workflow).",
		}, []string{"result"}),
		budgetWarns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_budget_warnings_total",
			Help: "Tenants that passed 80 % of a monthly budget (the first request past it each month), by kind (tokens, spend); the log line names the tenant.",
		}, []string{"kind"}),
		budgetOverTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_budget_overrun_tokens_total",
			Help: "Tokens requests used beyond their monthly budget reservation, charged to their tenant all the same, by the pool that answered; the log line names the tenant.",
		}, []string{"pool"}),
		budgetOverUSD: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_budget_overrun_usd_total",
			Help: "Spend (US dollars) requests used beyond their monthly budget reservation, charged all the same, by the pool that answered.",
		}, []string{"pool"}),
		permits:      newPermitCounters(),
		failovers:    newFailoverMetrics(),
		scrapeBudget: 2 * time.Second,
	}
	m.healing = newHealingLevels()
	m.reg.MustRegister(m.stages, m.requests, m.queueWait, m.ttft, m.tokens, m.actions, m.healing,
		m.rateLimits, m.alerts, m.bans, m.banned, m.connsRefused, m.usageWrites, m.budgetWarns, m.budgetOverTokens, m.budgetOverUSD, buildInfo(version.Get()),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(m.permits.collectors()...)
	m.reg.MustRegister(m.failovers.collectors()...)
	return m
}

// buildInfo is sluice_build_info, always 1, whose labels name the build:
// joined on the instance, it tells which version each process runs (a
// rollout half done shows two).
func buildInfo(b version.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sluice_build_info",
		Help:        "Always 1; the labels name this process's build: its version, git commit and Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "go_version": b.GoVersion},
	})
	g.Set(1)
	return g
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
	// Tier is the caller's tier (limits.tiers; bounded by configuration).
	Tier    string
	Timings []events.StageTiming
	// PromptTokens and CompletionTokens are the LLM call's usage (0 when
	// no call was made).
	PromptTokens, CompletionTokens int
}

// ObserveRequest counts a finished request and observes its stages.
func (m *Metrics) ObserveRequest(r Request) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(r.Outcome, r.Route).Inc()
	for _, t := range r.Timings {
		m.stages.WithLabelValues(t.Stage, r.Route, t.Cache, r.Outcome).Observe(float64(t.Ms) / 1000)
		if t.Stage == request.StageAdmission {
			m.queueWait.WithLabelValues(r.Route, r.Tier).Observe(float64(t.Ms) / 1000)
		}
	}
	if d, ok := TimeToFirstToken(r.Timings); ok {
		m.ttft.WithLabelValues(r.Route, r.Tier).Observe(d.Seconds())
	}
	if r.PromptTokens > 0 || r.CompletionTokens > 0 {
		m.tokens.WithLabelValues(r.Route, r.Tier, "prompt").Add(float64(r.PromptTokens))
		m.tokens.WithLabelValues(r.Route, r.Tier, "completion").Add(float64(r.CompletionTokens))
	}
}

// TimeToFirstToken is the client's wait for its first token, stage by
// stage: every stage before the LLM's first token, plus that. Unlike
// llm_first_token it counts the admission queue. ok is false when no
// token came.
func TimeToFirstToken(timings []events.StageTiming) (d time.Duration, ok bool) {
	var ms int64
	for _, t := range timings {
		switch t.Stage {
		case request.StageLLM: // the whole answer: past the first token
		case request.StageLLMFirstToken:
			ok = true
			ms += t.Ms
		default:
			ms += t.Ms
		}
	}
	return time.Duration(ms) * time.Millisecond, ok
}

// Refused counts a request refused at the door (its outcome label says
// why), before any workflow ran.
func (m *Metrics) Refused(outcome string) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(outcome, "").Inc()
}

// BudgetWarning counts a tenant's first request past 80 % of its monthly
// budget of kind (tokens, spend). No label names the tenant: its log line
// does.
func (m *Metrics) BudgetWarning(kind string) {
	if m == nil {
		return
	}
	m.budgetWarns.WithLabelValues(kind).Inc()
}

// BudgetOverrun counts what a request answered in pool used beyond its
// monthly budget reservation: tokens and micro-dollars, charged to its
// tenant all the same. No label names the tenant: the log line does.
func (m *Metrics) BudgetOverrun(pool string, tokens, micros int64) {
	if m == nil {
		return
	}
	m.budgetOverTokens.WithLabelValues(pool).Add(float64(max(tokens, 0)))
	m.budgetOverUSD.WithLabelValues(pool).Add(float64(max(micros, 0)) / 1e6)
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

// Banned counts a request refused because its IP or key was banned, by
// what was banned (ip, key). No ban label names the address or the key:
// their number is unbounded, and logs name them.
func (m *Metrics) Banned(kind string) {
	if m == nil {
		return
	}
	m.banned.WithLabelValues(kind).Inc()
}

// ConnectionRefused counts a connection refused at accept for being
// beyond limit (the setting's name), answered or closed unanswered.
func (m *Metrics) ConnectionRefused(limit string, answered bool) {
	if m == nil {
		return
	}
	m.connsRefused.WithLabelValues(limit, strconv.FormatBool(answered)).Inc()
}

// UsageRecorded counts a write to the usage ledger by its result
// (inserted, duplicate, failed).
func (m *Metrics) UsageRecorded(result string) {
	if m == nil {
		return
	}
	m.usageWrites.WithLabelValues(result).Inc()
}

// BanImposed counts a ban imposed, by what it names (ip, key).
func (m *Metrics) BanImposed(kind string) {
	if m == nil {
		return
	}
	m.bans.WithLabelValues(kind).Inc()
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
	// OldestWait is how long the longest-waiting request has queued.
	OldestWait time.Duration
	// Backlog is each tenant's requests that wait for a free permit
	// (admission.QueueStats.Backlog), for the per-tenant series.
	Backlog map[string]int
}

// RegisterPools exposes each pool's permits and queue, read when scraped
// (bounded by a short timeout, so a slow Redis makes a scrape miss the
// gauges, not hang), and with TrackTenants each tenant's backlog; the
// pools' utilisation counters start at 0.
func (m *Metrics) RegisterPools(pools []string, stats func(ctx context.Context, pool string) (PoolStats, error)) {
	if m == nil {
		return
	}
	m.permits.start(pools)
	m.reg.MustRegister(&poolCollector{pools: pools, stats: stats, budget: m.scrapeBudget, logger: m.logger, tenants: m.tenants})
}

var (
	inUseDesc   = prometheus.NewDesc("sluice_pool_permits_in_use", "LLM permits held, per pool.", []string{"pool"}, nil)
	limitDesc   = prometheus.NewDesc("sluice_pool_permits_limit", "LLM permits a pool has, per pool.", []string{"pool"}, nil)
	waitingDesc = prometheus.NewDesc("sluice_pool_queue_depth", "Requests waiting for a permit, per pool.", []string{"pool"}, nil)
	oldestDesc  = prometheus.NewDesc("sluice_pool_queue_oldest_wait_seconds", "How long the longest-waiting request of a pool has queued (0 when none waits).", []string{"pool"}, nil)
)

type poolCollector struct {
	pools  []string
	stats  func(ctx context.Context, pool string) (PoolStats, error)
	budget time.Duration
	logger *slog.Logger
	// tenants, if not nil, takes the tenants' backlogs.
	tenants *tenants
	last    snapshot
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inUseDesc
	ch <- limitDesc
	ch <- waitingDesc
	ch <- oldestDesc
	if c.tenants != nil {
		ch <- tenantBacklogDesc
	}
}

// Collect reads every pool's state from Redis; scrapes within snapshotTTL
// of a read see its result.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) { c.last.collect(ch, c.read) }

func (c *poolCollector) read(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.budget)
	defer cancel()
	backlogs := map[string]map[string]int{}
	for _, pool := range c.pools {
		st, err := c.stats(ctx, pool)
		if err != nil {
			c.logger.Warn("metrics: read pool stats", "pool", pool, "err", err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(inUseDesc, prometheus.GaugeValue, float64(st.InUse), pool)
		ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(st.Limit), pool)
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(st.Waiting), pool)
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, st.OldestWait.Seconds(), pool)
		backlogs[pool] = st.Backlog
	}
	if c.tenants != nil {
		// The same read as the pool's gauges: no more Redis work per scrape.
		c.tenants.backlog(backlogs, ch)
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

// KBMemory is what a worker's loaded knowledge bases take, and what
// became of them (retrieval.MemoryStats).
type KBMemory struct {
	Budget, Loaded, Reserved  int64
	KBs                       int
	Loads, Evictions, Refused uint64
}

// RegisterKBMemory exposes the loaded knowledge bases' memory against its
// budget, read from stats when scraped.
func (m *Metrics) RegisterKBMemory(stats func() KBMemory) {
	if m == nil {
		return
	}
	gauge := func(name, help string, v func(KBMemory) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return v(stats()) })
	}
	counter := func(name, help string, v func(KBMemory) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return v(stats()) })
	}
	m.reg.MustRegister(
		gauge("sluice_retrieval_kb_loaded_bytes", "Memory the knowledge bases this process holds take, by its estimate.",
			func(s KBMemory) float64 { return float64(s.Loaded) }),
		gauge("sluice_retrieval_kb_reserved_bytes", "Memory reserved for the knowledge bases this process is loading, by their recorded estimate.",
			func(s KBMemory) float64 { return float64(s.Reserved) }),
		gauge("sluice_retrieval_kb_budget_bytes", "Memory this process holds for knowledge bases (retrieval.kb_memory_bytes).",
			func(s KBMemory) float64 { return float64(s.Budget) }),
		gauge("sluice_retrieval_kbs_loaded", "Knowledge bases this process holds.",
			func(s KBMemory) float64 { return float64(s.KBs) }),
		counter("sluice_retrieval_kb_loads_total", "Knowledge bases loaded whole: first used, or used again after eviction.",
			func(s KBMemory) float64 { return float64(s.Loads) }),
		counter("sluice_retrieval_kb_evictions_total", "Knowledge bases dropped to stay within the memory budget.",
			func(s KBMemory) float64 { return float64(s.Evictions) }),
		counter("sluice_retrieval_kb_refused_total", "Queries of knowledge bases larger than the memory budget, refused.",
			func(s KBMemory) float64 { return float64(s.Refused) }),
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
