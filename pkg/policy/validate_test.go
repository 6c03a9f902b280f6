package policy

import (
	"strings"
	"testing"
)

// A policy is checked against the deployment's settings it must fit, and
// each problem is named by the configuration file's field.
func TestCheckNamesTheDeploymentsFields(t *testing.T) {
	d := Deployment{MaxTokensLimit: 1000, KeyTiers: []string{"", "standard"}, SharedPermits: 16,
		Models: map[string]string{"short": "small", "long": "big"}, Priced: map[string]bool{"big": true}, Ledger: "off"}
	if err := d.Check(base()); err != nil {
		t.Fatalf("base policy: %v", err)
	}
	cases := []struct {
		name   string
		change func(p *Policy)
		want   string
	}{
		{"key's tier", func(p *Policy) { delete(p.Limits.Tiers, "standard"); p.Limits.DefaultTier = "free" },
			`auth.api_keys[1].tier: names unknown tier "standard"`},
		{"shared permits", func(p *Policy) { p.Pools["short"] = 17 },
			"pools.short.max_concurrency: must not exceed pools.shared.max_concurrency (16): the pools share their servers, got 17"},
		{"no permits", func(p *Policy) { p.Pools["long"] = 0 }, "pools.long.max_concurrency: must be > 0, got 0"},
		{"output tokens", func(p *Policy) { p.Limits.Tiers["free"] = Tier{Weight: 1, MaxOutputTokens: 1001} },
			"limits.tiers.free.max_output_tokens: must be between 0 and api.max_tokens_limit (1000), got 1001"},
		{"ledger", func(p *Policy) { p.Limits.Tiers["free"] = Tier{Weight: 1, Budget: Budget{TokensPerMonth: 5}} },
			`limits.tiers.free.budget: needs usage.store (the ledger a lost counter is rebuilt from), got store "off"`},
		{"price", func(p *Policy) { p.Limits.Tiers["free"] = Tier{Weight: 1, Budget: Budget{SpendPerMonthUSD: 5}} },
			`limits.tiers.free.budget.spend_per_month_usd: needs a price for model "small" (pools.short.model) in prices`},
		{"route", func(p *Policy) {
			p.Limits.Tiers["free"] = Tier{Weight: 1, Routes: RouteLimits{Ingest: RouteRate{IPPerMinute: -1}}}
		},
			"limits.tiers.free.routes.ingest: rates must be >= 0 (0 = no limit), got {TenantPerMinute:0 IPPerMinute:-1}"},
	}
	for _, tc := range cases {
		p := base()
		tc.change(&p)
		err := d.Check(p)
		if err == nil || !strings.HasPrefix(err.Error(), "invalid config:\n  ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
