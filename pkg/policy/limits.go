package policy

import "time"

// Limits are the per-tier traffic rules: token-bucket rate limits at the
// door and the tier's share of the admission queue.
type Limits struct {
	// Enabled turns the rate limits at the door on; tier weights, waits
	// and queue caps apply either way.
	Enabled bool
	// DefaultTier is the tier of callers whose API key names none, and of
	// anonymous callers.
	DefaultTier string
	// Tiers by name (e.g. free, standard, vip).
	Tiers map[string]Tier
}

// Tier is one service level. Its JSON is the admin API's (MaxWait is
// written by Policy's MarshalJSON, as a duration string).
type Tier struct {
	// Weight is the tier's share in weighted fair queuing: with weights
	// 5:3:2 and all backlogged, tenants are served 50/30/20.
	Weight int `json:"weight"`
	// MaxWait bounds a queued request's wait; 0 uses the deployment's
	// default wait.
	MaxWait time.Duration `json:"-"`
	// MaxQueuePerTenant caps one tenant's waiting requests per pool; 0 is
	// no cap beyond the queue's depth.
	MaxQueuePerTenant int `json:"max_queue_per_tenant"`
	// MaxConcurrent caps the permits (streams at once) one tenant holds in
	// a pool; 0 is no cap beyond the pool's permits. A tenant at its cap
	// keeps its place in the queue while others are granted.
	MaxConcurrent int `json:"max_concurrent"`
	// MaxOutputTokens caps a request's max_tokens; 0 is the deployment's
	// limit.
	MaxOutputTokens int `json:"max_output_tokens"`
	// Rate limits by dimension; a zero Rate is no limit.
	Tenant Rate `json:"tenant"`
	User   Rate `json:"user"`
	IP     Rate `json:"ip"`
	// Routes limits the routes besides the chat POSTs, which cost little
	// each but a Redis read, a Temporal call or an embedding apiece.
	Routes RouteLimits `json:"routes"`
	// IngestQuota bounds what one tenant stores in its own kbs.
	IngestQuota IngestQuota `json:"ingest_quota"`
	// Budget bounds what one tenant uses in a month.
	Budget Budget `json:"budget,omitzero"`
}

// Budget is a tier's monthly budget per tenant (UTC calendar months); 0
// is no limit. Spend counts tokens at the configured prices.
type Budget struct {
	TokensPerMonth   int64   `json:"tokens_per_month,omitempty"`
	SpendPerMonthUSD float64 `json:"spend_per_month_usd,omitempty"`
}

// IngestQuota is what one tenant may store across its kbs; 0 is no limit.
type IngestQuota struct {
	Documents int64 `json:"documents,omitempty"`
	// Bytes counts the stored text: titles and chunks (which overlap, so
	// a document stores somewhat more than its text).
	Bytes int64 `json:"bytes,omitempty"`
}

// RouteLimits are a tier's request rates for the routes besides the chat
// POSTs, each per tenant and per client address.
type RouteLimits struct {
	// Reads: request status (a Temporal query each), kbs and sessions.
	Reads RouteRate `json:"reads"`
	// Resumes: event streams re-attached (a signal each).
	Resumes RouteRate `json:"resumes"`
	// Ingest: document writes and deletes (embeddings and index work).
	Ingest RouteRate `json:"ingest"`
}

// The routes RouteLimits names, as its fields are spelled in JSON.
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
	TenantPerMinute float64 `json:"tenant_per_minute,omitempty"`
	IPPerMinute     float64 `json:"ip_per_minute,omitempty"`
}

// Rate is a token bucket in tokens (TPM-style), in requests (RPM-style), or
// both. Bursts default to one minute's worth.
type Rate struct {
	TokensPerMinute   float64 `json:"tokens_per_minute,omitempty"`
	TokenBurst        float64 `json:"token_burst,omitempty"`
	RequestsPerMinute float64 `json:"requests_per_minute,omitempty"`
	RequestBurst      float64 `json:"request_burst,omitempty"`
}
