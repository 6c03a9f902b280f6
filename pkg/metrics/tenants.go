package metrics

import (
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// OtherTenants is the tenant label of every tenant without series of its
// own. No managed tenant can be named so: a tenant name begins with a
// letter or a digit (pkg/keys).
const OtherTenants = "_other"

// tenantIdle is how long a tenant with series of its own may go without
// being served or queued before a newcomer may take its place. It is
// longer than the recording rules' 5-minute window, so that a tenant is
// not dropped from a rate still being computed over it.
const tenantIdle = 10 * time.Minute

// TenantService is what one finished request was served: its LLM call's
// tokens, by its tenant, the pool that served it and the caller's tier
// (whose weight was its share of the pool).
type TenantService struct {
	Tenant, Pool, Tier             string
	PromptTokens, CompletionTokens int
}

var (
	tenantTokensDesc = prometheus.NewDesc("sluice_tenant_llm_tokens_total",
		"Tokens of finished LLM calls per tenant, by pool, tier and kind (prompt, completion): the service each tenant was granted. "+
			"At most metrics.tenant_series tenants have series of their own per process, the rest are tenant=\""+OtherTenants+"\".",
		[]string{"tenant", "pool", "tier", "kind"}, nil)
	tenantBacklogDesc = prometheus.NewDesc("sluice_tenant_backlog",
		"Requests of a tenant queued in a pool that wait for a free permit (its entries parked behind its tier's max_concurrent excepted), "+
			"read from Redis when scraped; 0 for a tenant with series of its own and nothing waiting.",
		[]string{"tenant", "pool"}, nil)
	tierWeightDesc = prometheus.NewDesc("sluice_tier_weight",
		"Each tier's weight in the admission queue's weighted fair sharing, as the live policy says.", []string{"tier"}, nil)
)

// tenantFamilies are the metric families whose labels name tenants.
var tenantFamilies = map[string]bool{"sluice_tenant_llm_tokens_total": true, "sluice_tenant_backlog": true}

// TrackTenants turns the per-tenant series on, with at most max tenants
// having series of their own in this process (metrics.tenant_series); 0
// leaves them off. Call it once, before RegisterPools.
func (m *Metrics) TrackTenants(max int) {
	if m == nil || max <= 0 {
		return
	}
	m.tenants = newTenants(max)
	m.reg.MustRegister(m.tenants)
}

// TenantServed counts what a finished request was served.
func (m *Metrics) TenantServed(s TenantService) {
	if m == nil || m.tenants == nil {
		return
	}
	m.tenants.serve(s)
}

// RegisterTierWeights exposes each tier's weight, read from weights when
// scraped: the recording rules divide a tenant's service by its tier's
// weight, the share the admission queue gives it.
func (m *Metrics) RegisterTierWeights(weights func() map[string]int) {
	if m == nil {
		return
	}
	m.reg.MustRegister(tierWeights(weights))
}

// PublicHandler is Handler without the series that name tenants: what the
// API serves on its public port when metrics.addr does not move /metrics
// off it, where anyone, every tenant included, could read them.
func (m *Metrics) PublicHandler() http.Handler {
	return promhttp.HandlerFor(withoutTenants{m.reg}, promhttp.HandlerOpts{Registry: m.reg, ErrorLog: slogPrinter{m.logger}})
}

type withoutTenants struct{ g prometheus.Gatherer }

func (w withoutTenants) Gather() ([]*dto.MetricFamily, error) {
	families, err := w.g.Gather()
	out := families[:0]
	for _, f := range families {
		if !tenantFamilies[f.GetName()] {
			out = append(out, f)
		}
	}
	return out, err
}

// tenants counts service per tenant and decides which tenants have series
// of their own. Labels must stay bounded, and a counter must never go
// down, so a tenant keeps its series until it is dropped whole, and a
// tenant without one is counted under OtherTenants from then on. Tenants
// that wait in a queue come first: fairness is about them.
type tenants struct {
	max int
	now func() time.Time

	mu  sync.Mutex
	own map[string]*ownTenant
	// tokens is each label's (a tenant's, or OtherTenants') counters.
	tokens map[string]map[tokenSeries]float64
}

type ownTenant struct {
	// active is when the tenant was last served or seen queued.
	active time.Time
	// backlogged: it had a backlog at the last read of the queues.
	backlogged bool
}

type tokenSeries struct{ pool, tier, kind string }

func newTenants(max int) *tenants {
	return &tenants{max: max, now: time.Now, own: map[string]*ownTenant{}, tokens: map[string]map[tokenSeries]float64{}}
}

func (t *tenants) serve(s TenantService) {
	t.mu.Lock()
	defer t.mu.Unlock()
	label := t.label(s.Tenant, false)
	series := t.tokens[label]
	if series == nil {
		series = map[tokenSeries]float64{}
		t.tokens[label] = series
	}
	// Both kinds, so that both series exist from the tenant's first
	// request on and rate() sees their first increase.
	series[tokenSeries{s.Pool, s.Tier, "prompt"}] += float64(max(s.PromptTokens, 0))
	series[tokenSeries{s.Pool, s.Tier, "completion"}] += float64(max(s.CompletionTokens, 0))
}

// label is tenant's label, giving it series of its own when there is (or
// can be made) room; backlogged says it has a backlog now. t.mu is held.
func (t *tenants) label(tenant string, backlogged bool) string {
	if tenant == "" || tenant == OtherTenants {
		return OtherTenants
	}
	now := t.now()
	if o, ok := t.own[tenant]; ok {
		o.active = now
		o.backlogged = o.backlogged || backlogged
		return tenant
	}
	if !t.makeRoom(now, backlogged) {
		return OtherTenants
	}
	t.own[tenant] = &ownTenant{active: now, backlogged: backlogged}
	return tenant
}

// makeRoom makes a place for a newcomer when every place is taken, by
// dropping the tenant least recently active among those without a
// backlog: for a backlogged newcomer at once, for another only once that
// tenant has been idle for tenantIdle. A dropped tenant's series vanish
// (Prometheus marks them stale); no other series goes down. t.mu is held.
func (t *tenants) makeRoom(now time.Time, backlogged bool) bool {
	if len(t.own) < t.max {
		return true
	}
	victim, oldest := "", time.Time{}
	for name, o := range t.own {
		if o.backlogged {
			continue
		}
		if victim == "" || o.active.Before(oldest) || o.active.Equal(oldest) && name < victim {
			victim, oldest = name, o.active
		}
	}
	if victim == "" || !backlogged && now.Sub(oldest) < tenantIdle {
		return false
	}
	delete(t.own, victim)
	delete(t.tokens, victim)
	return true
}

// backlog takes each pool's backlog by tenant, as just read from Redis:
// it marks the tenants that have one (the largest first take free
// places) and sends each pool's sluice_tenant_backlog series.
func (t *tenants) backlog(byPool map[string]map[string]int, ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	total := map[string]int{}
	for _, byTenant := range byPool {
		for tenant, n := range byTenant {
			if n > 0 {
				total[tenant] += n
			}
		}
	}
	// Mark the tenants that keep a backlog before any newcomer looks for
	// a place, so that none takes theirs.
	now := t.now()
	for name, o := range t.own {
		if o.backlogged = total[name] > 0; o.backlogged {
			o.active = now
		}
	}
	var newcomers []string
	for tenant := range total {
		if _, ok := t.own[tenant]; !ok {
			newcomers = append(newcomers, tenant)
		}
	}
	sort.Slice(newcomers, func(i, j int) bool {
		a, b := newcomers[i], newcomers[j]
		return total[a] > total[b] || total[a] == total[b] && a < b
	})
	for _, tenant := range newcomers {
		t.label(tenant, true)
	}
	for pool, byTenant := range byPool {
		other := 0
		for tenant, n := range byTenant {
			if _, ok := t.own[tenant]; !ok {
				other += n
			}
		}
		for tenant := range t.own {
			ch <- prometheus.MustNewConstMetric(tenantBacklogDesc, prometheus.GaugeValue, float64(byTenant[tenant]), tenant, pool)
		}
		ch <- prometheus.MustNewConstMetric(tenantBacklogDesc, prometheus.GaugeValue, float64(other), OtherTenants, pool)
	}
}

func (t *tenants) Describe(ch chan<- *prometheus.Desc) { ch <- tenantTokensDesc }

func (t *tenants) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for label, series := range t.tokens {
		for s, v := range series {
			ch <- prometheus.MustNewConstMetric(tenantTokensDesc, prometheus.CounterValue, v, label, s.pool, s.tier, s.kind)
		}
	}
}

type tierWeights func() map[string]int

func (w tierWeights) Describe(ch chan<- *prometheus.Desc) { ch <- tierWeightDesc }

func (w tierWeights) Collect(ch chan<- prometheus.Metric) {
	for tier, weight := range w() {
		ch <- prometheus.MustNewConstMetric(tierWeightDesc, prometheus.GaugeValue, float64(weight), tier)
	}
}
