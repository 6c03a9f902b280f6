package budget

import "math"

// Price is a model's price in US dollars per million tokens.
type Price struct {
	Input, Output float64
}

// Micros is what prompt and completion tokens cost, to the nearest
// micro-dollar.
func (p Price) Micros(prompt, completion int64) int64 {
	return int64(math.Round(float64(prompt)*p.Input + float64(completion)*p.Output))
}

// dearer is the higher of each of p's and q's prices.
func (p Price) dearer(q Price) Price {
	return Price{Input: max(p.Input, q.Input), Output: max(p.Output, q.Output)}
}

// Prices price a pool's requests: what one may use (Bound) and what one
// used (At). A zero price is one a model does not have, which only a
// tier without a spend budget allows.
type Prices struct {
	// Models are the models' prices, by the model name a pool sends
	// (prices.<model>).
	Models map[string]Price
	// Pools are each pool's model's price, by pool.
	Pools map[string]Price
	// Fallbacks are, by pool, the models that may answer a request queued
	// there in its model's place (its fallbacks' models).
	Fallbacks map[string][]string
}

// Bound is what a request queued in pool is reserved at: the dearest of
// the models that may answer it (the pool's own and its fallbacks'),
// each price taken on its own, so that a fallback answer costs no more
// than was reserved for its tokens.
func (p Prices) Bound(pool string) Price {
	b := p.Pools[pool]
	for _, m := range p.Fallbacks[pool] {
		b = b.dearer(p.At(pool, m))
	}
	return b
}

// At is what a request answered in pool by model spends: model's price
// when it has one, else the pool's model's (a backend that names the model
// otherwise than the pool asked for it, or a stream that broke before
// naming it). Settle and FromLedger both price with it, from the pool and
// model the ledger records, so a month rebuilt from the ledger agrees with
// one settled.
func (p Prices) At(pool, model string) Price {
	if pr, ok := p.Models[model]; ok && model != "" {
		return pr
	}
	return p.Pools[pool]
}
