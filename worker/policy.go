package worker

import (
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
)

// NewPolicy is the live traffic policy's store, starting from the
// configuration file's policy and checking every new one the way the file
// is checked.
func NewPolicy(rdb redis.UniversalClient, cfg config.Config, gate policy.PoolLimiter, logger *slog.Logger) *policy.Store {
	return policy.NewStore(rdb, policy.Options{
		KeyPrefix: cfg.Redis.KeyPrefix, Base: PolicyOf(cfg), Gate: gate, Validate: policyValidator(cfg), Logger: logger,
	})
}

// PolicyOf is the live policy the configuration file describes: limits.*
// but the bans (not part of the live policy), and each pool's
// max_concurrency.
func PolicyOf(cfg config.Config) policy.Policy {
	l := cfg.Limits
	tiers := make(map[string]policy.Tier, len(l.Tiers))
	for name, t := range l.Tiers {
		tiers[name] = tierOf(t)
	}
	return policy.Policy{
		Limits: policy.Limits{Enabled: l.Enabled, DefaultTier: l.DefaultTier, Tiers: tiers},
		Pools:  map[string]int{request.PoolShort: cfg.Pools.Short.MaxConcurrency, request.PoolLong: cfg.Pools.Long.MaxConcurrency},
	}
}

func tierOf(t config.Tier) policy.Tier {
	r := t.Routes
	return policy.Tier{
		Weight: t.Weight, MaxWait: t.MaxWait, MaxQueuePerTenant: t.MaxQueuePerTenant, MaxConcurrent: t.MaxConcurrent,
		MaxOutputTokens: t.MaxOutputTokens,
		Tenant:          policy.Rate(t.Tenant), User: policy.Rate(t.User), IP: policy.Rate(t.IP),
		Routes: policy.RouteLimits{Reads: policy.RouteRate(r.Reads), Resumes: policy.RouteRate(r.Resumes),
			Ingest: policy.RouteRate(r.Ingest)},
		IngestQuota: policy.IngestQuota(t.IngestQuota),
		Budget:      policy.Budget(t.Budget),
	}
}

func configTier(t policy.Tier) config.Tier {
	r := t.Routes
	return config.Tier{
		Weight: t.Weight, MaxWait: t.MaxWait, MaxQueuePerTenant: t.MaxQueuePerTenant, MaxConcurrent: t.MaxConcurrent,
		MaxOutputTokens: t.MaxOutputTokens,
		Tenant:          config.Rate(t.Tenant), User: config.Rate(t.User), IP: config.Rate(t.IP),
		Routes: config.RouteLimits{Reads: config.RouteRate(r.Reads), Resumes: config.RouteRate(r.Resumes),
			Ingest: config.RouteRate(r.Ingest)},
		IngestQuota: config.IngestQuota(t.IngestQuota),
		Budget:      config.Budget(t.Budget),
	}
}

// policyValidator checks a policy the way the configuration file is
// checked, as base with the policy's limits and pools in place, so that
// its errors name bad fields by their YAML path. The policy store has
// checked that it names exactly the short and long pools.
func policyValidator(base config.Config) func(policy.Policy) error {
	return func(p policy.Policy) error {
		cfg := base
		cfg.Limits.Enabled, cfg.Limits.DefaultTier = p.Limits.Enabled, p.Limits.DefaultTier
		cfg.Limits.Tiers = make(map[string]config.Tier, len(p.Limits.Tiers))
		for name, t := range p.Limits.Tiers {
			cfg.Limits.Tiers[name] = configTier(t)
		}
		cfg.Pools.Short.MaxConcurrency, cfg.Pools.Long.MaxConcurrency = p.Pools[request.PoolShort], p.Pools[request.PoolLong]
		// Shrinking may take a pool below its configured floor for healing;
		// the floor bounds the healer, not the policy.
		cfg.Pools.Short.Healing.MinPermits, cfg.Pools.Long.Healing.MinPermits = 1, 1
		if f := p.LongCostFactor; f != 0 && !(f >= 1 && f <= config.MaxLongCostFactor) {
			return fmt.Errorf("invalid policy: long_cost_factor must be 0 (off) or between 1 and %d, got %v", config.MaxLongCostFactor, f)
		}
		return cfg.Validate()
	}
}
