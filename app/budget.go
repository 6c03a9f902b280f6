package app

import (
	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// NewBudgets is the monthly budgets' counter, with the models' prices; a
// month Redis lost is rebuilt from the usage ledger (nil: from zero;
// budgets need the ledger, which config validation enforces), its spend
// priced as settling prices it.
func NewBudgets(rdb redis.UniversalClient, cfg config.Config, ledger usage.Store) *budget.Counter {
	opts := budget.Options{KeyPrefix: cfg.Redis.KeyPrefix, Prices: prices(cfg)}
	if ledger != nil {
		opts.Rebuild = budget.FromLedger(ledger, opts.Prices)
	}
	return budget.New(rdb, opts)
}

// prices are the models' prices (prices.<model>), each pool's model's, and
// the models each pool's fallbacks may answer with; zero for a model
// without one, which only a tier without a spend budget allows.
func prices(cfg config.Config) budget.Prices {
	p := budget.Prices{Models: map[string]budget.Price{}, Pools: map[string]budget.Price{}, Fallbacks: map[string][]string{}}
	for model, pr := range cfg.Prices {
		p.Models[model] = budget.Price{Input: pr.InputPerMillionUSD, Output: pr.OutputPerMillionUSD}
	}
	pools := cfg.Pools.ByName()
	for name, pool := range pools {
		p.Pools[name] = p.Models[pool.Model]
		for _, f := range pool.Fallbacks {
			model := f.Model
			if f.Pool != "" {
				model = pools[f.Pool].Model
			}
			p.Fallbacks[name] = append(p.Fallbacks[name], model)
		}
	}
	return p
}
