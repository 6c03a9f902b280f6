package config

import (
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Healing configures the tail-latency healer: every Interval it reads
// each pool's P99/P50 of Stage over Window, its queue, timeout rate and
// backend KV-cache use, warns above the warn thresholds and, above the
// critical ones, escalates per pool: shrink the batch, throttle long
// requests, scale out, shed the lowest tier's waiters; it steps back
// after HealthyPolls healthy polls in a row.
type Healing struct {
	// Enabled starts the healing workflow with the worker.
	Enabled bool `yaml:"enabled"`
	// Interval between polls; Window is how far back each poll looks (at
	// most metrics.latency_retention).
	Interval time.Duration `yaml:"interval"`
	Window   time.Duration `yaml:"window"`
	// Stage is the stage whose P99/P50 is watched (request.TimedSeries).
	Stage string `yaml:"stage"`
	// WarnRatio and CriticalRatio are P99/P50 thresholds.
	WarnRatio     float64 `yaml:"warn_ratio"`
	CriticalRatio float64 `yaml:"critical_ratio"`
	// WarnKVCache is the backend KV-cache use (0..1) that warns.
	WarnKVCache float64 `yaml:"warn_kv_cache"`
	// CriticalQueueDepth and CriticalTimeoutRate (queue timeouts per
	// request) are critical too.
	CriticalQueueDepth  int     `yaml:"critical_queue_depth"`
	CriticalTimeoutRate float64 `yaml:"critical_timeout_rate"`
	// CriticalP99 makes a P99 of the watched stage above it critical
	// whatever P99/P50 says (0: off): when overload collapses a pool, P50
	// grows too and the ratio understates the tail (bench-heal shows it).
	CriticalP99 time.Duration `yaml:"critical_p99"`
	// MinSamples: fewer latencies in the window and the ratio is ignored.
	MinSamples int64 `yaml:"min_samples"`
	// HealthyPolls in a row step a pool back a level; Cooldown is the
	// least time between two level changes of a pool.
	HealthyPolls int           `yaml:"healthy_polls"`
	Cooldown     time.Duration `yaml:"cooldown"`
	// LongCostFactor is how hard throttling bears on long requests: they
	// are charged this multiple of their tokens against token rate
	// limits, and the long pool's permits are divided by it.
	LongCostFactor float64 `yaml:"long_cost_factor"`
	// PollsPerRun bounds one workflow run's history (then continue-as-new).
	PollsPerRun int `yaml:"polls_per_run"`
	// AlertWebhook receives a JSON POST for every alert ("": none);
	// AlertTimeout bounds it.
	AlertWebhook string        `yaml:"alert_webhook"`
	AlertTimeout time.Duration `yaml:"alert_timeout"`
	// MetricsTimeout bounds reading a backend's /metrics.
	MetricsTimeout time.Duration `yaml:"metrics_timeout"`
}

// PoolHealing bounds the healer's shrinking of a pool.
type PoolHealing struct {
	// MinPermits is the fewest permits shrinking leaves (it halves
	// max_concurrency).
	MinPermits int `yaml:"min_permits"`
	// BaseBatch is the backends' max_num_seqs, which shrinking halves
	// through their admin API (llmsim's POST /admin/config); 0: the batch
	// is not tuned, the permits are the only batch control (vLLM and TGI
	// cannot change it at run time).
	BaseBatch int `yaml:"base_batch"`
	// MinBatch is the smallest max_num_seqs shrinking sets.
	MinBatch int `yaml:"min_batch"`
	// TTFTSLO is the first-token time the pool's clients are promised,
	// from their request to their first token, waiting included: while the
	// P99 of that (the ttft stage) is within it, a tail ratio alone does
	// not make the pool critical, as cutting it would cost other clients
	// (the long pool's) and give its own nothing. 0: the ratio alone.
	TTFTSLO time.Duration `yaml:"ttft_slo"`
}

func defaultHealing() Healing {
	return Healing{
		Enabled: true, Interval: 10 * time.Second, Window: 30 * time.Second, Stage: request.StageLLMFirstToken,
		WarnRatio: 2, CriticalRatio: 5, WarnKVCache: 0.75, CriticalQueueDepth: 100, CriticalTimeoutRate: 0.05,
		MinSamples: 50, HealthyPolls: 3, Cooldown: 30 * time.Second, LongCostFactor: 2, PollsPerRun: 500,
		AlertTimeout: 5 * time.Second, MetricsTimeout: 2 * time.Second,
	}
}

func defaultPoolHealing() PoolHealing {
	return PoolHealing{MinPermits: 1, MinBatch: 1}
}

// validate checks the healer's settings; its window must fit in the
// latencies metrics keep (latencyRetention).
func (h Healing) validate(v *validator, latencyRetention time.Duration) {
	v.duration("healing.interval", h.Interval)
	v.duration("healing.window", h.Window)
	if h.Window > latencyRetention {
		v.add("healing.window", "must not exceed metrics.latency_retention (%s), got %s", latencyRetention, h.Window)
	}
	if !slices.Contains(request.TimedSeries(), h.Stage) {
		v.add("healing.stage", "must be one of %s, got %q", strings.Join(request.TimedSeries(), ", "), h.Stage)
	}
	h.validateThresholds(v)
	h.validatePacing(v)
	if !(h.LongCostFactor >= 1 && h.LongCostFactor <= policy.MaxLongCostFactor) {
		v.add("healing.long_cost_factor", "must be between 1 and %d, got %v", policy.MaxLongCostFactor, h.LongCostFactor)
	}
	v.positive("healing.polls_per_run", int64(h.PollsPerRun))
	v.optionalHTTPURL("healing.alert_webhook", h.AlertWebhook)
	v.duration("healing.alert_timeout", h.AlertTimeout)
	v.duration("healing.metrics_timeout", h.MetricsTimeout)
}

// validateThresholds checks what makes a pool warn or critical.
func (h Healing) validateThresholds(v *validator) {
	if !(h.WarnRatio > 1) {
		v.add("healing.warn_ratio", "must be > 1 (P99 is never below P50), got %v", h.WarnRatio)
	}
	if !(h.CriticalRatio >= h.WarnRatio) {
		v.add("healing.critical_ratio", "must be at least healing.warn_ratio (%v), got %v", h.WarnRatio, h.CriticalRatio)
	}
	v.fraction("healing.warn_kv_cache", h.WarnKVCache)
	v.positive("healing.critical_queue_depth", int64(h.CriticalQueueDepth))
	if h.CriticalP99 < 0 {
		v.add("healing.critical_p99", "must not be negative, got %s", h.CriticalP99)
	}
	v.fraction("healing.critical_timeout_rate", h.CriticalTimeoutRate)
	v.positive("healing.min_samples", h.MinSamples)
}

// validatePacing checks when the healer may act again after an action.
func (h Healing) validatePacing(v *validator) {
	v.positive("healing.healthy_polls", int64(h.HealthyPolls))
	// A step back must rest on a whole window of healthy latencies, or the
	// healer undoes an action while the window still shows its effect
	// rather than the load (bench-heal saw the tail return 12 s after a
	// step back taken too early).
	if h.HealthyPolls > 0 && time.Duration(h.HealthyPolls)*h.Interval < h.Window {
		v.add("healing.healthy_polls", "healthy_polls × interval (%s) must be at least healing.window (%s)",
			time.Duration(h.HealthyPolls)*h.Interval, h.Window)
	}
	// The window must hold only latencies from after an action before the
	// next decision, or the healer escalates again on the tail it already
	// answered.
	if h.Cooldown < h.Window {
		v.add("healing.cooldown", "must be at least healing.window (%s), got %s", h.Window, h.Cooldown)
	}
}

// validate checks the healing bounds of the pool at YAML path pool, whose
// max_concurrency is maxConcurrency.
func (h PoolHealing) validate(v *validator, pool string, maxConcurrency int) {
	if h.TTFTSLO < 0 {
		v.add(pool+".healing.ttft_slo", "must not be negative, got %s", h.TTFTSLO)
	}
	if h.MinPermits < 1 || (maxConcurrency > 0 && h.MinPermits > maxConcurrency) {
		v.add(pool+".healing.min_permits", "must be between 1 and %s.max_concurrency (%d), got %d", pool, maxConcurrency, h.MinPermits)
	}
	if h.BaseBatch < 0 {
		v.add(pool+".healing.base_batch", "must be >= 0 (0: the batch is not tuned), got %d", h.BaseBatch)
	}
	if h.MinBatch < 1 || (h.BaseBatch > 0 && h.MinBatch > h.BaseBatch) {
		v.add(pool+".healing.min_batch", "must be between 1 and %s.healing.base_batch (%d), got %d", pool, h.BaseBatch, h.MinBatch)
	}
}
