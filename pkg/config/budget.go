package config

import (
	"math"
	"sort"
)

// Price is a model's price in US dollars per million tokens.
type Price struct {
	InputPerMillionUSD  float64 `yaml:"input_per_million_usd"`
	OutputPerMillionUSD float64 `yaml:"output_per_million_usd"`
}

// Prices are the models' prices, by the model name a pool sends.
type Prices map[string]Price

// validate checks the prices. That every pool's model has one when a
// tier's budget counts spend is the live policy's check
// (PolicyDeployment).
func (p Prices) validate(v *validator) {
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
}
