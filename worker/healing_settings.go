package worker

import (
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// HealingSettings is the healing workflow's settings from config, pools
// short then long: what StartHealing starts (or updates) the healer with.
func HealingSettings(cfg config.Config) workflows.HealingSettings {
	h := cfg.Healing
	s := workflows.HealingSettings{
		Interval: h.Interval, Window: h.Window, Stage: h.Stage,
		WarnRatio: h.WarnRatio, CriticalRatio: h.CriticalRatio, WarnKVCache: h.WarnKVCache,
		CriticalQueueDepth: h.CriticalQueueDepth, CriticalTimeoutRate: h.CriticalTimeoutRate,
		CriticalP99: h.CriticalP99,
		MinSamples:  h.MinSamples, HealthyPolls: h.HealthyPolls, Cooldown: h.Cooldown,
		LongCostFactor: h.LongCostFactor, PollsPerRun: h.PollsPerRun,
	}
	pools := cfg.Pools.ByName()
	for _, name := range request.Pools() {
		p := pools[name]
		b := workflows.PoolBounds{
			Pool: name, BasePermits: p.MaxConcurrency, MinPermits: p.Healing.MinPermits,
			BaseBatch: p.Healing.BaseBatch, BaseReplicas: p.Scaler.BaseReplicas, TTFTSLO: p.Healing.TTFTSLO,
		}
		if b.BaseBatch > 0 {
			b.MinBatch = p.Healing.MinBatch
		}
		if p.Scaler.Kind != config.ScalerNone {
			b.MaxReplicas = p.Scaler.MaxReplicas
		}
		s.Pools = append(s.Pools, b)
	}
	return s
}
