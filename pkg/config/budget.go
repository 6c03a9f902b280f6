package config

import (
	"math"
	"sort"
)

// Budget is a tier's monthly budget per tenant (UTC calendar months);
// 0 is no limit.
type Budget struct {
	// TokensPerMonth bounds prompt plus completion tokens.
	TokensPerMonth int64 `yaml:"tokens_per_month"`
	// SpendPerMonthUSD bounds the tokens' cost at prices.*; every pool's
	// model needs a price then.
	SpendPerMonthUSD float64 `yaml:"spend_per_month_usd"`
}

// On reports whether the budget limits anything.
func (b Budget) On() bool { return b.TokensPerMonth > 0 || b.SpendPerMonthUSD > 0 }

// Price is a model's price in US dollars per million tokens.
type Price struct {
	InputPerMillionUSD  float64 `yaml:"input_per_million_usd"`
	OutputPerMillionUSD float64 `yaml:"output_per_million_usd"`
}

// Prices are the models' prices, by the model name a pool sends.
type Prices map[string]Price

// validate checks the budget at YAML path field.
func (b Budget) validate(v *validator, field string) {
	if b.TokensPerMonth < 0 {
		v.add(field+".tokens_per_month", "must be >= 0 (0 = no limit), got %d", b.TokensPerMonth)
	}
	if b.SpendPerMonthUSD < 0 || math.IsNaN(b.SpendPerMonthUSD) || math.IsInf(b.SpendPerMonthUSD, 0) {
		v.add(field+".spend_per_month_usd", "must be >= 0 (0 = no limit), got %v", b.SpendPerMonthUSD)
	}
}

// validate checks the prices, that every pool's model has one when a
// tier's budget counts spend, and that budgets have the usage ledger they
// are rebuilt from.
func (p Prices) validate(v *validator, pools Pools, tiers map[string]Tier, ledger Usage) {
	models := make([]string, 0, len(p))
	for m := range p {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, m := range models {
		pr := p[m]
		if !(pr.InputPerMillionUSD >= 0 && pr.OutputPerMillionUSD >= 0) || math.IsInf(pr.InputPerMillionUSD+pr.OutputPerMillionUSD, 0) {
			v.add("prices."+m, "prices must be finite and >= 0, got %+v", pr)
		}
	}
	names := make([]string, 0, len(tiers))
	for name := range tiers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b := tiers[name].Budget
		field := "limits.tiers." + name + ".budget"
		if b.On() && !ledger.Enabled() {
			v.add(field, "needs usage.store (the ledger a lost counter is rebuilt from), got store %q", ledger.Store)
		}
		if b.SpendPerMonthUSD <= 0 {
			continue
		}
		seen := map[string]bool{}
		for _, pool := range []string{poolShort, poolLong} {
			model := pools.ByName()[pool].Model
			if _, ok := p[model]; !ok && !seen[model] {
				seen[model] = true
				v.add(field+".spend_per_month_usd", "needs a price for model %q (pools.%s.model) in prices", model, pool)
			}
		}
	}
}
