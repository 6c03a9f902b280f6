package policy

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/pkg/request"
)

// MaxLongCostFactor bounds how much more a long request may be charged
// against token rate limits while the healer throttles long requests.
const MaxLongCostFactor = 10

// Deployment is what a policy is checked against besides itself: the
// settings of the deployment it runs in, which the configuration file
// holds and names as given here. A policy put at run time is checked
// against the same settings as the file's own.
type Deployment struct {
	// MaxTokensLimit is api.max_tokens_limit, which no tier's
	// max_output_tokens may pass.
	MaxTokensLimit int
	// KeyTiers are the tiers auth.api_keys name, in their order ("" for
	// the default tier): each must stay a tier.
	KeyTiers []string
	// SharedPermits is pools.shared.max_concurrency when the pools share
	// their servers and it is set: neither pool may hold more permits. 0
	// is no such cap.
	SharedPermits int
	// Models are the models the pools send, by pool (pools.<pool>.model);
	// Priced are the models prices.* lists. A spend budget needs every
	// pool's model priced.
	Models map[string]string
	Priced map[string]bool
	// Ledger is usage.store, and HasLedger whether it records usage: a
	// budget needs the ledger its lost counter is rebuilt from.
	Ledger    string
	HasLedger bool
}

// Report takes one problem of a field, named by its path in the
// configuration file: the configuration's validator takes them with the
// file's own, Check gathers them into one error.
type Report func(field, format string, args ...any)

// Validate reports each problem of p in the deployment d to report, naming
// the field by its path in the configuration file (limits.tiers.free.weight,
// pools.short.max_concurrency): operators know the policy by those names,
// whether it comes from the file or from the admin API. The pools are
// those p names of request.Pools.
func (d Deployment) Validate(p Policy, report Report) {
	d.validatePools(p.Pools, report)
	d.validateLimits(p.Limits, report)
	d.validateBudgets(p.Limits.Tiers, report)
}

// Check is what a Store requires of a policy put at run time (its
// Options.Validate): a long_cost_factor in bounds, and no problem
// Validate finds. The problems read as an invalid configuration file's,
// since they name its fields.
func (d Deployment) Check(p Policy) error {
	if f := p.LongCostFactor; f != 0 && !(f >= 1 && f <= MaxLongCostFactor) {
		return fmt.Errorf("invalid policy: long_cost_factor must be 0 (off) or between 1 and %d, got %v", MaxLongCostFactor, f)
	}
	var problems []string
	d.Validate(p, func(field, format string, args ...any) {
		problems = append(problems, field+": "+fmt.Sprintf(format, args...))
	})
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("invalid config:\n  %s", strings.Join(problems, "\n  "))
}

// validatePools checks each pool's permit count.
func (d Deployment) validatePools(pools map[string]int, report Report) {
	for _, name := range request.Pools() {
		if n := pools[name]; n <= 0 {
			report("pools."+name+".max_concurrency", "must be > 0, got %d", n)
		}
	}
	if d.SharedPermits <= 0 {
		return
	}
	for _, name := range request.Pools() {
		if n := pools[name]; n > d.SharedPermits {
			report("pools."+name+".max_concurrency", "must not exceed pools.shared.max_concurrency (%d): the pools share their servers, got %d", d.SharedPermits, n)
		}
	}
}

// validateLimits checks the tiers, and that every tier named elsewhere
// (the default, the API keys') is one of them.
func (d Deployment) validateLimits(l Limits, report Report) {
	if len(l.Tiers) == 0 {
		report("limits.tiers", "must define at least one tier")
	}
	if _, ok := l.Tiers[l.DefaultTier]; !ok {
		report("limits.default_tier", "names unknown tier %q", l.DefaultTier)
	}
	for i, tier := range d.KeyTiers {
		if _, ok := l.Tiers[tier]; tier != "" && !ok {
			report(fmt.Sprintf("auth.api_keys[%d].tier", i), "names unknown tier %q", tier)
		}
	}
	// In name order, so that problems are reported in a stable order.
	for _, name := range slices.Sorted(maps.Keys(l.Tiers)) {
		l.Tiers[name].validate("limits.tiers."+name, d.MaxTokensLimit, report)
	}
}

// validate checks the tier at path field; no tier may let a request ask
// for more than maxTokensLimit.
func (t Tier) validate(field string, maxTokensLimit int, report Report) {
	if t.Weight <= 0 {
		report(field+".weight", "must be > 0, got %d", t.Weight)
	}
	if t.MaxWait < 0 {
		report(field+".max_wait", "must be >= 0, got %s", t.MaxWait)
	}
	if t.MaxQueuePerTenant < 0 {
		report(field+".max_queue_per_tenant", "must be >= 0, got %d", t.MaxQueuePerTenant)
	}
	if t.MaxConcurrent < 0 {
		report(field+".max_concurrent", "must be >= 0 (0 = no cap), got %d", t.MaxConcurrent)
	}
	if t.MaxOutputTokens < 0 || t.MaxOutputTokens > maxTokensLimit {
		report(field+".max_output_tokens", "must be between 0 and api.max_tokens_limit (%d), got %d", maxTokensLimit, t.MaxOutputTokens)
	}
	t.Tenant.validate(field+".tenant", report)
	t.User.validate(field+".user", report)
	t.IP.validate(field+".ip", report)
	t.Routes.validate(field+".routes", report)
	if t.IngestQuota.Documents < 0 || t.IngestQuota.Bytes < 0 {
		report(field+".ingest_quota", "must be >= 0 (0 = no limit), got %+v", t.IngestQuota)
	}
	if t.FileQuota.Bytes < 0 {
		report(field+".file_quota.bytes", "must be >= 0 (0 = no limit), got %d", t.FileQuota.Bytes)
	}
	t.Budget.validate(field+".budget", report)
	t.validateClasses(field, report)
}

// validate checks the routes' rates at path field.
func (r RouteLimits) validate(field string, report Report) {
	for _, route := range []string{RouteReads, RouteResumes, RouteIngest} {
		if rate := r.Of(route); rate.TenantPerMinute < 0 || rate.IPPerMinute < 0 {
			report(field+"."+route, "rates must be >= 0 (0 = no limit), got %+v", rate)
		}
	}
}

// validate checks the rate at path field. A zero rate is no limit, so a
// burst without its rate would be silently ignored.
func (r Rate) validate(field string, report Report) {
	if r.TokensPerMinute < 0 || r.TokenBurst < 0 || r.RequestsPerMinute < 0 || r.RequestBurst < 0 {
		report(field, "rates and bursts must be >= 0")
	}
	if r.TokensPerMinute == 0 && r.TokenBurst > 0 {
		report(field+".token_burst", "needs tokens_per_minute")
	}
	if r.RequestsPerMinute == 0 && r.RequestBurst > 0 {
		report(field+".request_burst", "needs requests_per_minute")
	}
}

// validate checks the budget at path field.
func (b Budget) validate(field string, report Report) {
	if b.TokensPerMonth < 0 {
		report(field+".tokens_per_month", "must be >= 0 (0 = no limit), got %d", b.TokensPerMonth)
	}
	if b.SpendPerMonthUSD < 0 || math.IsNaN(b.SpendPerMonthUSD) || math.IsInf(b.SpendPerMonthUSD, 0) {
		report(field+".spend_per_month_usd", "must be >= 0 (0 = no limit), got %v", b.SpendPerMonthUSD)
	}
}

// validateBudgets checks that the tiers' budgets have what they count
// with: the usage ledger, and a price for every pool's model when they
// count spend.
func (d Deployment) validateBudgets(tiers map[string]Tier, report Report) {
	for _, name := range slices.Sorted(maps.Keys(tiers)) {
		b := tiers[name].Budget
		field := "limits.tiers." + name + ".budget"
		if b.On() && !d.HasLedger {
			report(field, "needs usage.store (the ledger a lost counter is rebuilt from), got store %q", d.Ledger)
		}
		if b.SpendPerMonthUSD <= 0 {
			continue
		}
		seen := map[string]bool{}
		for _, pool := range request.Pools() {
			model := d.Models[pool]
			if !d.Priced[model] && !seen[model] {
				seen[model] = true
				report(field+".spend_per_month_usd", "needs a price for model %q (pools.%s.model) in prices", model, pool)
			}
		}
	}
}
