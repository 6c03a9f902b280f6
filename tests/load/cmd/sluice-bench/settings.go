package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/policy"
)

// mixFlags are the stack's flags in the scenarios that send both pools'
// traffic to one simulator: its speed, each pool's permits and the budget
// the two share (the pools name the same simulator, so they share one).
type mixFlags struct {
	timeScale                          float64
	shortPerms, longPerms, sharedPerms int
}

func (m *mixFlags) define(fs *flag.FlagSet, shortPerms, longPerms int) {
	fs.Float64Var(&m.timeScale, "time-scale", 1, "simulator time scale (1: real time)")
	fs.IntVar(&m.shortPerms, "short-permits", shortPerms, "permits of the short pool: its cap on the shared budget")
	fs.IntVar(&m.longPerms, "long-permits", longPerms, "permits of the long pool: its cap on the shared budget")
	fs.IntVar(&m.sharedPerms, "shared-permits", 0, "pools.shared.max_concurrency: the permits both pools share (0: the larger pool's)")
}

func (m mixFlags) simulator(sim *llmsim.Config) { sim.TimeScale = m.timeScale }

func (m mixFlags) configure(cfg *config.Config) {
	cfg.Pools.Short.MaxConcurrency = m.shortPerms
	cfg.Pools.Long.MaxConcurrency = m.longPerms
	cfg.Pools.Shared.MaxConcurrency = m.sharedPerms
}

// permits is how many streams the pools admit at once: their shared
// budget (both name the one simulator).
func (m mixFlags) permits() int {
	cfg := config.Default()
	m.configure(&cfg)
	return cfg.Pools.SharedLimit()
}

// tenantKeys are n API keys of tier, one tenant each, both named after
// the tier.
func tenantKeys(tier string, n int) []config.APIKey {
	keys := make([]config.APIKey, n)
	for t := range keys {
		keys[t] = config.APIKey{Key: fmt.Sprintf("k-%s-%02d", tier, t), Tenant: fmt.Sprintf("%s-%02d", tier, t), Tier: tier}
	}
	return keys
}

// addOpenTenants adds tier with the standard tier's share and queue caps
// but none of its rate limits, and the tier's keys: their load is to
// reach the queue and the pools, not stop at the door.
func addOpenTenants(cfg *config.Config, tier string, keys []config.APIKey) {
	std := cfg.Limits.Tiers["standard"]
	cfg.Limits.Tiers[tier] = policy.Tier{Weight: std.Weight, MaxWait: std.MaxWait, MaxQueuePerTenant: std.MaxQueuePerTenant}
	cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, keys...)
}

// positives parses a flag's comma-separated list of positive numbers,
// blank entries left out.
func positives[T int | float64](flagName, what, list string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(list, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		v, err := parse(strings.TrimSpace(f))
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-%s: bad %s %q", flagName, what, f)
		}
		out = append(out, v)
	}
	return out, nil
}

func parseFloat(s string) (float64, error) { return strconv.ParseFloat(s, 64) }
