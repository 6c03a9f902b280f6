package app

import (
	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// newBudgets is the monthly budgets' counter; a month Redis lost is
// rebuilt from the usage ledger (nil: from zero; budgets need the ledger,
// which config validation enforces), its spend priced by each pool's
// model as the door charges it.
func newBudgets(rdb redis.UniversalClient, cfg config.Config, ledger usage.Store) *budget.Counter {
	opts := budget.Options{KeyPrefix: cfg.Redis.KeyPrefix}
	if ledger != nil {
		opts.Rebuild = budget.FromLedger(ledger, func(pool string) budget.Price { return priceOf(cfg, pool) })
	}
	return budget.New(rdb, opts)
}

// priceOf is the price of pool's model (prices.<model>); zero when it has
// none, which only a tier without a spend budget allows.
func priceOf(cfg config.Config, pool string) budget.Price {
	p := cfg.Prices[cfg.Pools.ByName()[pool].Model]
	return budget.Price{Input: p.InputPerMillionUSD, Output: p.OutputPerMillionUSD}
}
