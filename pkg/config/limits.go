package config

import (
	"fmt"
	"sort"
	"time"
)

// Limits are the per-tier traffic rules: token-bucket rate limits at the
// door and the tier's share of the admission queue.
type Limits struct {
	// Enabled turns the rate limits at the door on; tier weights, waits
	// and queue caps apply either way.
	Enabled bool `yaml:"enabled"`
	// DefaultTier is the tier of callers whose API key names none, and of
	// anonymous callers.
	DefaultTier string `yaml:"default_tier"`
	// Tiers by name (e.g. free, standard, vip).
	Tiers map[string]Tier `yaml:"tiers"`
	// Ban turns away floods; unlike the tiers it is not part of the live
	// policy.
	Ban Ban `yaml:"ban"`
}

// Tier is one service level.
type Tier struct {
	// Weight is the tier's share in weighted fair queuing: with weights
	// 5:3:2 and all backlogged, tenants are served 50/30/20.
	Weight int `yaml:"weight"`
	// MaxWait bounds a queued request's wait; 0 uses admission.max_wait.
	MaxWait time.Duration `yaml:"max_wait"`
	// MaxQueuePerTenant caps one tenant's waiting requests per pool; 0 is
	// no cap beyond admission.max_queue_depth.
	MaxQueuePerTenant int `yaml:"max_queue_per_tenant"`
	// MaxConcurrent caps the permits (streams at once) one tenant holds in
	// a pool; 0 is no cap beyond the pool's max_concurrency. A tenant at
	// its cap keeps its place in the queue while others are granted.
	MaxConcurrent int `yaml:"max_concurrent"`
	// MaxOutputTokens caps a request's max_tokens; 0 uses
	// api.max_tokens_limit.
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// Rate limits by dimension; a zero Rate is no limit.
	Tenant Rate `yaml:"tenant"`
	User   Rate `yaml:"user"`
	IP     Rate `yaml:"ip"`
	// Routes limits the routes besides the chat POSTs, which cost little
	// each but a Redis read, a Temporal call or an embedding apiece.
	Routes RouteLimits `yaml:"routes"`
	// IngestQuota bounds what one tenant stores in its own kbs.
	IngestQuota IngestQuota `yaml:"ingest_quota"`
	// Budget bounds what one tenant uses in a month.
	Budget Budget `yaml:"budget"`
}

// IngestQuota is what one tenant may store across its kbs; 0 is no limit.
type IngestQuota struct {
	Documents int64 `yaml:"documents"`
	// Bytes counts the stored text: titles and chunks (which overlap, so
	// a document stores somewhat more than its text).
	Bytes int64 `yaml:"bytes"`
}

// RouteLimits are a tier's request rates for the routes besides the chat
// POSTs, each per tenant and per client address.
type RouteLimits struct {
	// Reads: request status (a Temporal query each), kbs and sessions.
	Reads RouteRate `yaml:"reads"`
	// Resumes: event streams re-attached (a signal each).
	Resumes RouteRate `yaml:"resumes"`
	// Ingest: document writes and deletes (embeddings and index work).
	Ingest RouteRate `yaml:"ingest"`
}

// RouteRate is a route's requests per minute per tenant and per IP, each
// with a minute's burst; 0 is no limit.
type RouteRate struct {
	TenantPerMinute float64 `yaml:"tenant_per_minute"`
	IPPerMinute     float64 `yaml:"ip_per_minute"`
}

// Rate is a token bucket in tokens (TPM-style), in requests (RPM-style), or
// both. Bursts default to one minute's worth.
type Rate struct {
	TokensPerMinute   float64 `yaml:"tokens_per_minute"`
	TokenBurst        float64 `yaml:"token_burst"`
	RequestsPerMinute float64 `yaml:"requests_per_minute"`
	RequestBurst      float64 `yaml:"request_burst"`
}

func defaultLimits() Limits {
	return Limits{
		Enabled:     true,
		DefaultTier: "standard",
		Ban:         defaultBan(),
		Tiers: map[string]Tier{
			"free": {
				Weight: 2, MaxWait: 15 * time.Second, MaxQueuePerTenant: 100, MaxConcurrent: 2, MaxOutputTokens: 512,
				Tenant:      Rate{TokensPerMinute: 50000, RequestsPerMinute: 100},
				User:        Rate{TokensPerMinute: 20000, RequestsPerMinute: 30},
				IP:          Rate{RequestsPerMinute: 120},
				Routes:      RouteLimits{Reads: RouteRate{300, 300}, Resumes: RouteRate{60, 60}, Ingest: RouteRate{20, 20}},
				IngestQuota: IngestQuota{Documents: 1000, Bytes: 20 << 20},
			},
			"standard": {
				Weight: 3, MaxQueuePerTenant: 1000,
				Tenant:      Rate{TokensPerMinute: 200000, RequestsPerMinute: 300},
				User:        Rate{TokensPerMinute: 60000, RequestsPerMinute: 120},
				IP:          Rate{RequestsPerMinute: 600},
				Routes:      RouteLimits{Reads: RouteRate{1200, 600}, Resumes: RouteRate{300, 300}, Ingest: RouteRate{120, 120}},
				IngestQuota: IngestQuota{Documents: 100000, Bytes: 2 << 30},
			},
			"vip": {
				Weight: 5, MaxWait: 60 * time.Second, MaxQueuePerTenant: 5000,
				Tenant: Rate{TokensPerMinute: 1000000, RequestsPerMinute: 1000},
				Routes: RouteLimits{Reads: RouteRate{6000, 0}, Resumes: RouteRate{1200, 0}, Ingest: RouteRate{600, 0}},
			},
		},
	}
}

// validate checks the tiers, and that every tier named elsewhere (the
// default, the API keys') is one of them; no tier may let a request ask
// for more than maxTokensLimit (api.max_tokens_limit).
func (l Limits) validate(v *validator, keys []APIKey, maxTokensLimit int) {
	if len(l.Tiers) == 0 {
		v.add("limits.tiers", "must define at least one tier")
	}
	if l.Ban.Enabled {
		l.Ban.validate(v, "limits.ban")
	}
	if _, ok := l.Tiers[l.DefaultTier]; !ok {
		v.add("limits.default_tier", "names unknown tier %q", l.DefaultTier)
	}
	for i, k := range keys {
		if _, ok := l.Tiers[k.Tier]; k.Tier != "" && !ok {
			v.add(fmt.Sprintf("auth.api_keys[%d].tier", i), "names unknown tier %q", k.Tier)
		}
	}
	names := make([]string, 0, len(l.Tiers))
	for name := range l.Tiers {
		names = append(names, name)
	}
	sort.Strings(names) // report problems in a stable order
	for _, name := range names {
		l.Tiers[name].validate(v, "limits.tiers."+name, maxTokensLimit)
	}
}

// validate checks the tier at YAML path field.
func (t Tier) validate(v *validator, field string, maxTokensLimit int) {
	v.positive(field+".weight", int64(t.Weight))
	if t.MaxWait < 0 {
		v.add(field+".max_wait", "must be >= 0, got %s", t.MaxWait)
	}
	if t.MaxQueuePerTenant < 0 {
		v.add(field+".max_queue_per_tenant", "must be >= 0, got %d", t.MaxQueuePerTenant)
	}
	if t.MaxConcurrent < 0 {
		v.add(field+".max_concurrent", "must be >= 0 (0 = no cap), got %d", t.MaxConcurrent)
	}
	if t.MaxOutputTokens < 0 || t.MaxOutputTokens > maxTokensLimit {
		v.add(field+".max_output_tokens", "must be between 0 and api.max_tokens_limit (%d), got %d", maxTokensLimit, t.MaxOutputTokens)
	}
	t.Tenant.validate(v, field+".tenant")
	t.User.validate(v, field+".user")
	t.IP.validate(v, field+".ip")
	t.Routes.validate(v, field+".routes")
	if t.IngestQuota.Documents < 0 || t.IngestQuota.Bytes < 0 {
		v.add(field+".ingest_quota", "must be >= 0 (0 = no limit), got %+v", t.IngestQuota)
	}
	t.Budget.validate(v, field+".budget")
}

// validate checks the routes' rates at YAML path field.
func (r RouteLimits) validate(v *validator, field string) {
	routes := []struct {
		name string
		rate RouteRate
	}{{"reads", r.Reads}, {"resumes", r.Resumes}, {"ingest", r.Ingest}}
	for _, route := range routes {
		if route.rate.TenantPerMinute < 0 || route.rate.IPPerMinute < 0 {
			v.add(field+"."+route.name, "rates must be >= 0 (0 = no limit), got %+v", route.rate)
		}
	}
}

// validate checks the rate at YAML path field. A zero rate is no limit,
// so a burst without its rate would be silently ignored.
func (r Rate) validate(v *validator, field string) {
	if r.TokensPerMinute < 0 || r.TokenBurst < 0 || r.RequestsPerMinute < 0 || r.RequestBurst < 0 {
		v.add(field, "rates and bursts must be >= 0")
	}
	if r.TokensPerMinute == 0 && r.TokenBurst > 0 {
		v.add(field+".token_burst", "needs tokens_per_minute")
	}
	if r.RequestsPerMinute == 0 && r.RequestBurst > 0 {
		v.add(field+".request_burst", "needs requests_per_minute")
	}
}
