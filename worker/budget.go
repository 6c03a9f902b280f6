package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// NewBudgets is the monthly budgets' counter; a month Redis lost is
// rebuilt from the usage ledger (nil: from zero; budgets need the ledger,
// which config validation enforces).
func NewBudgets(rdb redis.UniversalClient, cfg config.Config, ledger usage.Store) *budget.Counter {
	opts := budget.Options{KeyPrefix: cfg.Redis.KeyPrefix, Prices: poolPrices(cfg)}
	if ledger != nil {
		opts.Rebuild = rebuildFrom(ledger, opts.Prices)
	}
	return budget.New(rdb, opts)
}

// poolPrices is each pool's model's price (prices.<model>), by pool.
func poolPrices(cfg config.Config) map[string]budget.Price {
	prices := map[string]budget.Price{}
	for name, pool := range cfg.Pools.ByName() {
		p := cfg.Prices[pool.Model]
		prices[name] = budget.Price{Input: p.InputPerMillionUSD, Output: p.OutputPerMillionUSD}
	}
	return prices
}

// rebuildFrom sums a tenant's ledger over a month, its spend priced by
// each pool's model as the door charges it.
func rebuildFrom(ledger usage.Store, prices map[string]budget.Price) budget.Rebuild {
	return func(ctx context.Context, tenant string, from, to time.Time) (budget.Used, error) {
		rows, err := ledger.Query(ctx, usage.Query{Tenant: tenant, From: from, To: to, GroupBy: usage.GroupPool})
		if err != nil {
			return budget.Used{}, fmt.Errorf("sum %s's usage by pool: %w", tenant, err)
		}
		var u budget.Used
		for _, r := range rows {
			u.Tokens += r.PromptTokens + r.CompletionTokens
			u.Micros += prices[r.Group].Micros(r.PromptTokens, r.CompletionTokens)
		}
		return u, nil
	}
}
