package app

import (
	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// NewBudgets is the monthly budgets' counter, with each pool's price; a
// month Redis lost is rebuilt from the usage ledger (nil: from zero;
// budgets need the ledger, which config validation enforces), its spend
// priced as the door charges it.
func NewBudgets(rdb redis.UniversalClient, cfg config.Config, ledger usage.Store) *budget.Counter {
	opts := budget.Options{KeyPrefix: cfg.Redis.KeyPrefix, Prices: poolPrices(cfg)}
	if ledger != nil {
		opts.Rebuild = budget.FromLedger(ledger, opts.Prices)
	}
	return budget.New(rdb, opts)
}

// poolPrices is each pool's model's price (prices.<model>), by pool; zero
// for a model without one, which only a tier without a spend budget
// allows.
func poolPrices(cfg config.Config) map[string]budget.Price {
	prices := map[string]budget.Price{}
	for name, pool := range cfg.Pools.ByName() {
		p := cfg.Prices[pool.Model]
		prices[name] = budget.Price{Input: p.InputPerMillionUSD, Output: p.OutputPerMillionUSD}
	}
	return prices
}
