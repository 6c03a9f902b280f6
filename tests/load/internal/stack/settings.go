package stack

import (
	"flag"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/policy"
)

// MixFlags are the stack's flags in the scenarios that send both pools'
// traffic to one simulator: its speed, each pool's permits and the budget
// the two share (the pools name the same simulator, so they share one).
type MixFlags struct {
	TimeScale                          float64
	ShortPerms, LongPerms, sharedPerms int
}

func (m *MixFlags) Define(fs *flag.FlagSet, shortPerms, longPerms int) {
	fs.Float64Var(&m.TimeScale, "time-scale", 1, "simulator time scale (1: real time)")
	fs.IntVar(&m.ShortPerms, "short-permits", shortPerms, "permits of the short pool: its cap on the shared budget")
	fs.IntVar(&m.LongPerms, "long-permits", longPerms, "permits of the long pool: its cap on the shared budget")
	fs.IntVar(&m.sharedPerms, "shared-permits", 0, "pools.shared.max_concurrency: the permits both pools share (0: the larger pool's)")
}

func (m MixFlags) Simulator(sim *llmsim.Config) { sim.TimeScale = m.TimeScale }

func (m MixFlags) Configure(cfg *config.Config) {
	cfg.Pools.Short.MaxConcurrency = m.ShortPerms
	cfg.Pools.Long.MaxConcurrency = m.LongPerms
	cfg.Pools.Shared.MaxConcurrency = m.sharedPerms
}

// Permits is how many streams the pools admit at once: their shared
// budget (both name the one simulator).
func (m MixFlags) Permits() int {
	cfg := config.Default()
	m.Configure(&cfg)
	return cfg.Pools.SharedLimit()
}

// TenantKeys are n API keys of tier, one tenant each, both named after
// the tier.
func TenantKeys(tier string, n int) []config.APIKey {
	keys := make([]config.APIKey, n)
	for t := range keys {
		keys[t] = config.APIKey{Key: fmt.Sprintf("k-%s-%02d", tier, t), Tenant: fmt.Sprintf("%s-%02d", tier, t), Tier: tier}
	}
	return keys
}

// AddOpenTenants adds tier with the standard tier's share and queue caps
// but none of its rate limits, and the tier's keys: their load is to
// reach the queue and the pools, not stop at the door.
func AddOpenTenants(cfg *config.Config, tier string, keys []config.APIKey) {
	std := cfg.Limits.Tiers["standard"]
	cfg.Limits.Tiers[tier] = policy.Tier{Weight: std.Weight, MaxWait: std.MaxWait, MaxQueuePerTenant: std.MaxQueuePerTenant}
	cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, keys...)
}
