// Package usage is Sluice's usage ledger: one Entry per finished chat
// request (answered, interrupted, cancelled, timed out in the queue, ...),
// written once from the request's durable finalisation and read back
// grouped by day, user, key, model, service class or tenant. It is the record that bills
// and budgets are made from; the per-tenant counters on /metrics are a
// view of the moment, this is the account.
//
// Two backends stand behind Store: SQLite (one file, the dev stack's and
// a single host's) and PostgreSQL (production: every API and worker
// shares it). Both take the same SQL and the same migrations.
package usage

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Entry is one finished request as the ledger keeps it. It holds no text
// of the prompt or the answer, and no key: KeyID names the key the way
// logs and bans do.
type Entry struct {
	// RequestID is unique: recording the same request again is a no-op,
	// which is what makes a retried record safe.
	RequestID string
	Tenant    string
	User      string
	// KeyID is the caller's key id (a managed key's id, cfg_ and the start
	// of a configured key's hash); empty for anonymous callers.
	KeyID string
	// Model is the model that answered (the pool's configured model when
	// the backend named none or the stream broke before it said); empty
	// when no model was called.
	Model string
	// Pool is the pool admission queued the request in ("" if it never
	// got that far); Route is where it was served: a pool, or
	// request.RouteCache for an answer from the answer cache.
	Pool  string
	Route string
	// PromptTokens and CompletionTokens are what the model call consumed
	// (in part, for a stream that broke or was cancelled midway);
	// CachedTokens are the completion tokens an answer-cache hit served
	// without calling a model.
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int
	// Outcome and Reason are the request's (pkg/request).
	Outcome string
	Reason  string
	// ServiceTier is the service class it was served in (request.Classes;
	// empty for records from before classes).
	ServiceTier string
	// FinishedAt is when the request ended (the workflow's clock).
	FinishedAt time.Time
}

// Validate reports an entry the ledger cannot key or date.
func (e Entry) Validate() error {
	switch {
	case e.RequestID == "":
		return errors.New("usage entry: request id is empty")
	case e.Tenant == "":
		return fmt.Errorf("usage entry %s: tenant is empty", e.RequestID)
	case e.FinishedAt.IsZero():
		return fmt.Errorf("usage entry %s: finish time is zero", e.RequestID)
	case e.PromptTokens < 0 || e.CompletionTokens < 0 || e.CachedTokens < 0:
		return fmt.Errorf("usage entry %s: negative token count", e.RequestID)
	}
	return nil
}

// GroupBy is what a Query sums usage by.
type GroupBy string

// The groupings. GroupTenant is for admins: a tenant's own query is one
// tenant already.
const (
	GroupDay    GroupBy = "day"
	GroupUser   GroupBy = "user"
	GroupKey    GroupBy = "key"
	GroupModel  GroupBy = "model"
	GroupTenant GroupBy = "tenant"
	// GroupClass sums by the service class requests were served in.
	GroupClass GroupBy = "service_tier"
	// GroupPool is the budgets': by pool and, within it, the model that
	// answered (Row.Model), which prices the spend (budget.Prices.At); the
	// usage routes do not offer it.
	GroupPool GroupBy = "pool"
)

// column is the ledger column a grouping reads.
var column = map[GroupBy]string{
	GroupDay: "day", GroupUser: "user_name", GroupKey: "key_id", GroupModel: "model", GroupTenant: "tenant", GroupPool: "pool, model",
	GroupClass: "service_tier",
}

// ParseGroupBy reads a grouping's name; tenant is allowed only when
// acrossTenants.
func ParseGroupBy(s string, acrossTenants bool) (GroupBy, error) {
	g := GroupBy(s)
	if _, ok := column[g]; !ok || g == GroupPool || (g == GroupTenant && !acrossTenants) {
		if acrossTenants {
			return "", fmt.Errorf("must be day, user, key, model, service_tier or tenant, got %q", s)
		}
		return "", fmt.Errorf("must be day, user, key, model or service_tier, got %q", s)
	}
	return g, nil
}

// DayLayout is how the ledger writes a day: UTC, sortable as text.
const DayLayout = "2006-01-02"

// Day is t's day in the ledger's terms (UTC).
func Day(t time.Time) string { return t.UTC().Format(DayLayout) }

// Query asks for usage summed by one grouping over a range of days.
type Query struct {
	// Tenant restricts the query to one tenant; "" reads every tenant,
	// which only the admin routes may ask for.
	Tenant string
	// From and To are UTC days, [From, To).
	From, To time.Time
	GroupBy  GroupBy
}

// splitsTenants reports whether q's rows are per tenant as well as per
// group: users and keys mean something only within their tenant, so a
// query across tenants keeps theirs apart.
func (q Query) splitsTenants() bool {
	return q.Tenant == "" && (q.GroupBy == GroupUser || q.GroupBy == GroupKey)
}

// Row is one group's usage.
type Row struct {
	// Tenant is set when the rows of a query across tenants are split by
	// tenant (grouped by tenant, user or key).
	Tenant string `json:"tenant,omitempty"`
	// Group is the group's value: a day (YYYY-MM-DD), a user, a key id, a
	// model or a tenant.
	Group string `json:"group"`
	// Model is the model that answered, when grouped by pool.
	Model string `json:"model,omitempty"`
	// Requests counts every finished request; Answered those that ended
	// with an answer (outcome done).
	Requests         int64 `json:"requests"`
	Answered         int64 `json:"answered"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	CachedTokens     int64 `json:"cached_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// Store is the ledger.
type Store interface {
	// Record writes e once: inserted is false when its request was already
	// recorded (a retry), and the ledger is left as it was.
	Record(ctx context.Context, e Entry) (inserted bool, err error)
	// Query sums usage as q asks, rows ordered by group (and tenant).
	Query(ctx context.Context, q Query) ([]Row, error)
	Close() error
}
