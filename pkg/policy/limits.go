package policy

import "time"

// The tier vocabulary below is both the configuration file's (limits.* in
// YAML, read by pkg/config) and the admin API's (JSON, written by
// Policy's MarshalJSON): one type each, tagged for both.

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
}

// Tier is one service level. In JSON, MaxWait and Classes are written by
// Policy's MarshalJSON, with durations as strings.
type Tier struct {
	// Weight is the tier's share in weighted fair queuing: with weights
	// 5:3:2 and all backlogged, tenants are served 50/30/20.
	Weight int `yaml:"weight" json:"weight"`
	// MaxWait bounds a queued request's wait; 0 uses admission.max_wait.
	MaxWait time.Duration `yaml:"max_wait" json:"-"`
	// MaxQueuePerTenant caps one tenant's waiting requests per pool; 0 is
	// no cap beyond admission.max_queue_depth.
	MaxQueuePerTenant int `yaml:"max_queue_per_tenant" json:"max_queue_per_tenant"`
	// MaxConcurrent caps the permits (streams at once) one tenant holds in
	// a pool; 0 is no cap beyond the pool's max_concurrency. A tenant at
	// its cap keeps its place in the queue while others are granted.
	MaxConcurrent int `yaml:"max_concurrent" json:"max_concurrent"`
	// MaxOutputTokens caps a request's max_tokens; 0 uses
	// api.max_tokens_limit.
	MaxOutputTokens int `yaml:"max_output_tokens" json:"max_output_tokens"`
	// Rate limits by dimension; a zero Rate is no limit.
	Tenant Rate `yaml:"tenant" json:"tenant"`
	User   Rate `yaml:"user" json:"user"`
	IP     Rate `yaml:"ip" json:"ip"`
	// Routes limits the routes besides the chat POSTs, which cost little
	// each but a Redis read, a Temporal call or an embedding apiece.
	Routes RouteLimits `yaml:"routes" json:"routes"`
	// IngestQuota bounds what one tenant stores in its own kbs.
	IngestQuota IngestQuota `yaml:"ingest_quota" json:"ingest_quota"`
	// FileQuota bounds what one tenant keeps in files (/v1/files).
	FileQuota FileQuota `yaml:"file_quota" json:"file_quota,omitzero"`
	// Budget bounds what one tenant uses in a month.
	Budget Budget `yaml:"budget" json:"budget,omitzero"`
	// Classes are the service classes (request.Classes) the tier's
	// callers may ask for with service_tier, each with its weight and
	// SLOs; none configured grants the default class alone, at Weight.
	// DefaultClass is the class of a request that names none or asks for
	// auto ("": default).
	Classes      map[string]ClassLimits `yaml:"classes" json:"-"`
	DefaultClass string                 `yaml:"default_class" json:"default_class,omitempty"`
}

// Budget is a tier's monthly budget per tenant (UTC calendar months); 0
// is no limit.
type Budget struct {
	// TokensPerMonth bounds prompt plus completion tokens.
	TokensPerMonth int64 `yaml:"tokens_per_month" json:"tokens_per_month,omitempty"`
	// SpendPerMonthUSD bounds the tokens' cost at prices.*; every pool's
	// model needs a price then.
	SpendPerMonthUSD float64 `yaml:"spend_per_month_usd" json:"spend_per_month_usd,omitempty"`
}

// On reports whether the budget limits anything.
func (b Budget) On() bool { return b.TokensPerMonth > 0 || b.SpendPerMonthUSD > 0 }

// FileQuota is what one tenant may keep in its files; 0 is no limit. A
// batch's output files are written over it: results are never dropped.
type FileQuota struct {
	Bytes int64 `yaml:"bytes" json:"bytes,omitempty"`
}

// IngestQuota is what one tenant may store across its kbs; 0 is no limit.
type IngestQuota struct {
	Documents int64 `yaml:"documents" json:"documents,omitempty"`
	// Bytes counts the stored text: titles and chunks (which overlap, so
	// a document stores somewhat more than its text).
	Bytes int64 `yaml:"bytes" json:"bytes,omitempty"`
}

// RouteLimits are a tier's request rates for the routes besides the chat
// POSTs, each per tenant and per client address.
type RouteLimits struct {
	// Reads: request status (a Temporal query each), kbs and sessions.
	Reads RouteRate `yaml:"reads" json:"reads"`
	// Resumes: event streams re-attached (a signal each), by a resume or
	// by a POST replayed with its Idempotency-Key.
	Resumes RouteRate `yaml:"resumes" json:"resumes"`
	// Ingest: document writes and deletes (embeddings and index work).
	Ingest RouteRate `yaml:"ingest" json:"ingest"`
}

// The routes RouteLimits names, as its fields are spelled in YAML and
// JSON.
const (
	RouteReads   = "reads"
	RouteResumes = "resumes"
	RouteIngest  = "ingest"
)

// Of is the named route's rate (no limit for a name it does not know).
func (r RouteLimits) Of(route string) RouteRate {
	switch route {
	case RouteReads:
		return r.Reads
	case RouteResumes:
		return r.Resumes
	case RouteIngest:
		return r.Ingest
	}
	return RouteRate{}
}

// RouteRate is a route's requests per minute per tenant and per IP, each
// with a minute's burst; 0 is no limit.
type RouteRate struct {
	TenantPerMinute float64 `yaml:"tenant_per_minute" json:"tenant_per_minute,omitempty"`
	IPPerMinute     float64 `yaml:"ip_per_minute" json:"ip_per_minute,omitempty"`
}

// Rate is a token bucket in tokens (TPM-style), in requests (RPM-style), or
// both. Bursts default to one minute's worth.
type Rate struct {
	TokensPerMinute   float64 `yaml:"tokens_per_minute" json:"tokens_per_minute,omitempty"`
	TokenBurst        float64 `yaml:"token_burst" json:"token_burst,omitempty"`
	RequestsPerMinute float64 `yaml:"requests_per_minute" json:"requests_per_minute,omitempty"`
	RequestBurst      float64 `yaml:"request_burst" json:"request_burst,omitempty"`
}
