package api

import (
	"encoding/csv"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// maxUsageDays bounds the range one usage query sums over.
const maxUsageDays = 366

// defaultUsageDays is the range when from is not given: the last 30 days,
// today included.
const defaultUsageDays = 30

var errUsageOff = &refusal.Error{Class: refusal.NotFound, Code: "usage_disabled", Message: "the usage ledger is off on this server (usage.store)"}

// getUsage answers GET /v1/usage: the caller's own tenant's usage, never
// another's, whatever it asks.
func (s *Server) getUsage(c echo.Context) error {
	who, err := s.authenticateFor(c, policy.RouteReads)
	if err != nil {
		return err
	}
	if who.KeyID == "" {
		// Anonymous callers share a tenant: its usage is no one's own.
		return &refusal.Error{Class: refusal.Unauthenticated, Code: "unauthorized", Message: "an API key is required to read usage (Authorization: Bearer <key>)"}
	}
	if s.usage == nil {
		return errUsageOff
	}
	q, csvOut, err := usageQuery(c, time.Now(), false)
	if err != nil {
		return err
	}
	q.Tenant = who.Tenant
	var b *budgetStatus
	if !csvOut {
		if b, err = s.budgetOf(c, who.Tenant, who.Tier); err != nil {
			return err
		}
	}
	return s.writeUsage(c, q, csvOut, b)
}

// budgetStatus is the caller's tenant's monthly budget, in GET /v1/usage.
type budgetStatus struct {
	// TokensLimit and SpendLimitUSD are absent when not limited.
	TokensLimit   int64   `json:"tokens_limit,omitempty"`
	TokensUsed    int64   `json:"tokens_used"`
	SpendLimitUSD float64 `json:"spend_limit_usd,omitempty"`
	SpendUsedUSD  float64 `json:"spend_used_usd"`
	ResetsAt      string  `json:"resets_at"`
}

// budgetOf reads the tenant's month when its tier has a budget (nil
// otherwise). Used counts the requests still running at their bound.
func (s *Server) budgetOf(c echo.Context, tenant, tierName string) (*budgetStatus, error) {
	tier, _ := s.policy.Current().Tier(tierName)
	lim := door.LimitOf(tier)
	if s.budgets == nil || !lim.On() {
		return nil, nil
	}
	st, err := s.budgets.Status(c.Request().Context(), tenant, lim)
	if err != nil {
		s.logger.Error("read budget", "tenant", tenant, "err", err)
		return nil, refusal.Unreachable("budget counter unavailable; please retry")
	}
	return &budgetStatus{TokensLimit: lim.Tokens, TokensUsed: st.Used.Tokens, SpendLimitUSD: budget.USD(lim.Micros),
		SpendUsedUSD: budget.USD(st.Used.Micros), ResetsAt: st.ResetsAt.Format(time.RFC3339)}, nil
}

// getAdminUsage answers GET /v1/admin/usage: every tenant's usage, or
// one's (tenant=), grouped by tenant too.
func (s *Server) getAdminUsage(c echo.Context) error {
	if s.usage == nil {
		return errUsageOff
	}
	q, csvOut, err := usageQuery(c, time.Now(), true)
	if err != nil {
		return err
	}
	q.Tenant = c.QueryParam("tenant")
	return s.writeUsage(c, q, csvOut, nil)
}

// usageQuery reads from, to, group_by and format; a bad one is a 400
// naming it.
func usageQuery(c echo.Context, now time.Time, acrossTenants bool) (usage.Query, bool, error) {
	bad := func(param, format string, args ...any) error {
		e := refusal.BadRequest("bad_"+param, param+": "+format, args...)
		e.Param = param
		return e
	}
	q := usage.Query{GroupBy: usage.GroupDay}
	today, _ := time.Parse(usage.DayLayout, usage.Day(now))
	q.To = today.AddDate(0, 0, 1)
	if v := c.QueryParam("to"); v != "" {
		d, err := time.Parse(usage.DayLayout, v)
		if err != nil {
			return q, false, bad("to", "must be a day as YYYY-MM-DD (UTC, excluded), got %.40q", v)
		}
		q.To = d
	}
	q.From = q.To.AddDate(0, 0, -defaultUsageDays)
	if v := c.QueryParam("from"); v != "" {
		d, err := time.Parse(usage.DayLayout, v)
		if err != nil {
			return q, false, bad("from", "must be a day as YYYY-MM-DD (UTC, included), got %.40q", v)
		}
		q.From = d
	}
	if !q.From.Before(q.To) {
		return q, false, bad("from", "must be before to (%s), got %s", usage.Day(q.To), usage.Day(q.From))
	}
	if q.To.Sub(q.From) > maxUsageDays*24*time.Hour {
		return q, false, bad("from", "the range may span at most %d days, got %s to %s", maxUsageDays, usage.Day(q.From), usage.Day(q.To))
	}
	if v := c.QueryParam("group_by"); v != "" {
		g, err := usage.ParseGroupBy(v, acrossTenants)
		if err != nil {
			return q, false, bad("group_by", "%v", err)
		}
		q.GroupBy = g
	}
	switch f := c.QueryParam("format"); f {
	case "", "json":
		return q, false, nil
	case "csv":
		return q, true, nil
	default:
		return q, false, bad("format", "must be json or csv, got %.40q", f)
	}
}

// usageResponse is the JSON body of the usage routes.
type usageResponse struct {
	Tenant  string      `json:"tenant,omitempty"`
	From    string      `json:"from"`
	To      string      `json:"to"`
	GroupBy string      `json:"group_by"`
	Rows    []usage.Row `json:"rows"`
	// Budget is the caller's month, when its tier has a budget.
	Budget *budgetStatus `json:"budget,omitempty"`
}

func (s *Server) writeUsage(c echo.Context, q usage.Query, csvOut bool, b *budgetStatus) error {
	rows, err := s.usage.Query(c.Request().Context(), q)
	if err != nil {
		s.logger.Error("query usage", "tenant", q.Tenant, "group_by", q.GroupBy, "err", err)
		return refusal.Unreachable("usage ledger unavailable; please retry")
	}
	if !csvOut {
		return c.JSON(http.StatusOK, usageResponse{Tenant: q.Tenant, From: usage.Day(q.From), To: usage.Day(q.To), GroupBy: string(q.GroupBy), Rows: rows, Budget: b})
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="usage-`+usage.Day(q.From)+`-`+usage.Day(q.To)+`.csv"`)
	c.Response().WriteHeader(http.StatusOK)
	w := csv.NewWriter(c.Response())
	_ = w.Write([]string{"tenant", string(q.GroupBy), "requests", "answered", "prompt_tokens", "completion_tokens", "cached_tokens", "total_tokens"})
	for _, r := range rows {
		tenant := r.Tenant
		if tenant == "" {
			tenant = q.Tenant
		}
		_ = w.Write([]string{tenant, r.Group, itoa(r.Requests), itoa(r.Answered), itoa(r.PromptTokens),
			itoa(r.CompletionTokens), itoa(r.CachedTokens), itoa(r.TotalTokens)})
	}
	w.Flush()
	return w.Error()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
