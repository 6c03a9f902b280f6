package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/alert"
	"github.com/sluice-dev/sluice/pkg/backend"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/scaler"
)

// Healing holds the dependencies of the healer's activities: one reads the
// signals, each of the others is one action, so that every action shows in
// the healing workflow's history with its input. Actions take absolute
// values (a retry is a no-op) and refuse values outside the pool's
// configured bounds, whatever the workflow asks.
//
// It is a struct of its own, registered on the same worker as Chat;
// its method names must not collide with Chat's (activity names are
// method names).
type Healing struct {
	Gate    *admission.Gate
	Latency *latency.Window
	// Policy is the live policy the permit count and the long-request
	// charge are published through.
	Policy *policy.Store
	Pools  map[string]HealingPool
	// Notifier tells the workflow of each shed request.
	Notifier ShedNotifier
	Metrics  *metrics.Metrics
	// Backends reads the pools' backends' /metrics and sets their batch
	// through /admin/config.
	Backends backend.Client
	// Alerts receives each alert; one without a URL sends none.
	Alerts  alert.Webhook
	Options HealingOptions
	Logger  *slog.Logger
}

// HealingPool is what the healer may do to one pool.
type HealingPool struct {
	// Endpoints are the backends' base URLs (without "/v1"), where
	// /metrics and /admin/config are.
	Endpoints []string
	// MinPermits and MaxPermits bound SetPermits.
	MinPermits, MaxPermits int
	// MinBatch and MaxBatch bound SetBatch; MaxBatch 0: the batch is not
	// tuned and SetBatch refuses.
	MinBatch, MaxBatch int
	// Scaler is nil when the pool has none; MinReplicas and MaxReplicas
	// bound Scale.
	Scaler                   scaler.Scaler
	MinReplicas, MaxReplicas int
	// Circuits reads the circuit of each of the pool's endpoints in this
	// worker's LLM client; nil when the client has none.
	Circuits func() []llm.Circuit
}

// HealingOptions are the healer's activity settings from config.
type HealingOptions struct {
	// ShedNotifyConcurrency bounds the cancel signals in flight while
	// shedding; 0 is 16.
	ShedNotifyConcurrency int
}

// ShedNotifier tells a shed request's workflow that it was shed (the
// worker sends the cancel signal with reason shed). A request whose
// workflow is gone is not an error.
type ShedNotifier interface {
	NotifyShed(ctx context.Context, pool, requestID string) error
}

func (h *Healing) pool(name string) (HealingPool, error) {
	p, ok := h.Pools[name]
	if !ok {
		return HealingPool{}, temporal.NewNonRetryableApplicationError("unknown pool "+name, ErrTypeBadRequest, nil)
	}
	return p, nil
}

func outOfBounds(format string, args ...any) error {
	return temporal.NewNonRetryableApplicationError(fmt.Sprintf(format, args...), ErrTypeOutOfBounds, nil)
}

// ReadHealth reads each pool's health: its tail over the shared latency
// window, its admission gate, and its backends' vLLM metrics. A backend
// that does not answer is not an error (-1 when none did); Redis failing
// is.
func (h *Healing) ReadHealth(ctx context.Context, in HealthInput) (HealthOutput, error) {
	out := HealthOutput{Pools: make([]PoolHealth, len(in.Pools))}
	for pool, level := range in.Levels {
		// Three polls without hearing again, and this instance stops
		// reporting it: another worker runs the healer's polls now.
		h.Metrics.HealingLevel(pool, level, 3*in.Interval)
	}
	for i, name := range in.Pools {
		p, err := h.pool(name)
		if err != nil {
			return HealthOutput{}, err
		}
		ph := PoolHealth{Pool: name}
		stats, err := h.Latency.Snapshots(ctx, in.Window,
			latency.Series(in.Stage, name), latency.Series("requests", name), latency.Series("queue_timeouts", name),
			latency.Series(request.SeriesTTFT, name))
		if err != nil {
			return HealthOutput{}, fmt.Errorf("read health of pool %s: %w", name, err)
		}
		tail := stats[0]
		ph.Samples = tail.Count
		ph.P50Ms = float64(tail.P50) / float64(time.Millisecond)
		ph.P99Ms = float64(tail.P99) / float64(time.Millisecond)
		ph.Ratio = tail.TailRatio()
		ph.Requests, ph.Timeouts = stats[1].Added, stats[2].Added
		ph.TTFTSamples, ph.TTFTP99Ms = stats[3].Count, float64(stats[3].P99)/float64(time.Millisecond)
		if ph.Requests > 0 {
			ph.TimeoutRate = float64(ph.Timeouts) / float64(ph.Requests)
		}
		gs, err := h.Gate.Stats(ctx, name)
		if err != nil {
			return HealthOutput{}, fmt.Errorf("read health of pool %s: %w", name, err)
		}
		ph.QueueDepth, ph.InUse, ph.Permits = gs.Waiting, gs.InUse, gs.Limit
		ph.KVCacheUsage, ph.BackendWaiting = h.backendHealth(ctx, name, p.Endpoints)
		ph.Endpoints, ph.Ejected = len(p.Endpoints), ejected(p.Circuits)
		out.Pools[i] = ph
	}
	return out, nil
}

// ejected counts the endpoints whose circuit is open.
func ejected(circuits func() []llm.Circuit) int {
	if circuits == nil {
		return 0
	}
	n := 0
	for _, c := range circuits() {
		if c.State == llm.CircuitOpen {
			n++
		}
	}
	return n
}

// backendHealth reads every endpoint's /metrics at once and keeps the
// worst: one saturated replica is what makes the tail.
func (h *Healing) backendHealth(ctx context.Context, pool string, endpoints []string) (kvCache float64, waiting int) {
	kvCache, waiting = -1, -1
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ep := range endpoints {
		wg.Go(func() {
			m, err := h.Backends.Metrics(ctx, ep)
			if err != nil {
				h.Logger.Debug("read backend metrics", "pool", pool, "endpoint", ep, "err", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if m.KVCacheUsage >= 0 {
				kvCache = max(kvCache, m.KVCacheUsage)
			}
			if m.Waiting >= 0 {
				waiting = max(waiting, int(m.Waiting))
			}
		})
	}
	wg.Wait()
	return kvCache, waiting
}

// SetPermits sets a pool's permit count through the live policy, so that
// every instance and the admission gate take it.
func (h *Healing) SetPermits(ctx context.Context, in SetPermitsInput) error {
	p, err := h.pool(in.Pool)
	if err != nil {
		return err
	}
	if in.Permits < 1 || in.Permits < p.MinPermits || in.Permits > p.MaxPermits {
		return outOfBounds("permits of pool %s must be between %d and %d, got %d", in.Pool, max(p.MinPermits, 1), p.MaxPermits, in.Permits)
	}
	_, err = h.Policy.Update(ctx, func(pol *policy.Policy) bool {
		if pol.Pools[in.Pool] == in.Permits {
			return false
		}
		pol.Pools[in.Pool] = in.Permits
		return true
	})
	if err != nil {
		return fmt.Errorf("set permits of pool %s to %d: %w", in.Pool, in.Permits, err)
	}
	// An unchanged policy writes nothing; the gate gets the count anyway,
	// in case its override was changed behind the policy's back.
	if err := h.Gate.SetLimit(ctx, in.Pool, in.Permits); err != nil {
		return fmt.Errorf("set permits of pool %s to %d: %w", in.Pool, in.Permits, err)
	}
	h.Logger.Info("healing: permits set", "pool", in.Pool, "permits", in.Permits, "reason", in.Reason)
	h.Metrics.HealingAction(in.Pool, "set_permits")
	return nil
}

// SetBatch sets max_num_seqs on every endpoint of the pool that has a
// run-time admin API (GET/POST /admin/config, as llmsim serves). An
// endpoint without one (404) is counted, not applied; one that fails
// otherwise fails the call, to be retried whole (the value is absolute).
// Endpoints shared by both pools take the last pool's value.
func (h *Healing) SetBatch(ctx context.Context, in SetBatchInput) (SetBatchOutput, error) {
	p, err := h.pool(in.Pool)
	if err != nil {
		return SetBatchOutput{}, err
	}
	if p.MaxBatch == 0 {
		return SetBatchOutput{}, outOfBounds("pool %s's batch is not tuned (pools.%s.healing.base_batch is 0)", in.Pool, in.Pool)
	}
	if in.MaxNumSeqs < max(p.MinBatch, 1) || in.MaxNumSeqs > p.MaxBatch {
		return SetBatchOutput{}, outOfBounds("max_num_seqs of pool %s must be between %d and %d, got %d", in.Pool, max(p.MinBatch, 1), p.MaxBatch, in.MaxNumSeqs)
	}
	out := SetBatchOutput{Endpoints: len(p.Endpoints)}
	var errs []error
	for _, ep := range p.Endpoints {
		applied, err := h.Backends.SetBatch(ctx, ep, in.MaxNumSeqs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if applied {
			out.Applied++
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("set max_num_seqs of pool %s to %d: %w", in.Pool, in.MaxNumSeqs, errors.Join(errs...))
	}
	h.Logger.Info("healing: batch set", "pool", in.Pool, "maxNumSeqs", in.MaxNumSeqs, "applied", out.Applied, "endpoints", out.Endpoints, "reason", in.Reason)
	h.Metrics.HealingAction(in.Pool, "set_batch")
	return out, nil
}

// ThrottleLong sets the factor long requests are charged against token
// rate limits at the door (1 or 0: off), through the live policy.
func (h *Healing) ThrottleLong(ctx context.Context, in ThrottleLongInput) error {
	f := in.CostFactor
	if f == 1 {
		f = 0
	}
	if f != 0 && !(f >= 1 && f <= policy.MaxLongCostFactor) {
		return outOfBounds("long cost factor must be 1 (off) to %d, got %v", policy.MaxLongCostFactor, in.CostFactor)
	}
	_, err := h.Policy.Update(ctx, func(p *policy.Policy) bool {
		if p.LongCostFactor == f {
			return false
		}
		p.LongCostFactor = f
		return true
	})
	if err != nil {
		return fmt.Errorf("set long cost factor to %v: %w", in.CostFactor, err)
	}
	h.Logger.Info("healing: long requests charged", "factor", max(f, 1), "reason", in.Reason)
	h.Metrics.HealingAction(request.PoolLong, "throttle_long")
	return nil
}

// Scale asks the pool's scaler for an absolute replica count.
func (h *Healing) Scale(ctx context.Context, in ScaleInput) error {
	p, err := h.pool(in.Pool)
	if err != nil {
		return err
	}
	if p.Scaler == nil {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("pool %s has no scaler (pools.%s.scaler.kind is none)", in.Pool, in.Pool), ErrTypeNoScaler, nil)
	}
	if in.Replicas < p.MinReplicas || in.Replicas > p.MaxReplicas {
		return outOfBounds("replicas of pool %s must be between %d and %d, got %d", in.Pool, p.MinReplicas, p.MaxReplicas, in.Replicas)
	}
	if err := p.Scaler.Scale(ctx, in.Replicas, in.Reason); err != nil {
		err = fmt.Errorf("scale pool %s to %d replicas: %w", in.Pool, in.Replicas, err)
		if scaler.Permanent(err) {
			return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeScaleRefused, err)
		}
		return err
	}
	h.Logger.Info("healing: scaled", "pool", in.Pool, "replicas", in.Replicas, "reason", in.Reason)
	h.Metrics.HealingAction(in.Pool, "scale")
	return nil
}

// Shed rejects the waiting requests of the pool's lowest tier (see
// admission.Gate.Shed: nothing unless two tiers wait) and tells each
// one's workflow, which ends it with a rejected event. The shed is keyed
// by the activity, so a retry re-sends the signals of the first attempt's
// requests instead of shedding the next tier. A signal that fails is
// logged, not retried: the shed request's next re-check answers Shed.
func (h *Healing) Shed(ctx context.Context, in ShedInput) (ShedOutput, error) {
	if _, err := h.pool(in.Pool); err != nil {
		return ShedOutput{}, err
	}
	opts := admission.ShedOptions{Max: in.Max}
	if activity.IsActivity(ctx) {
		info := activity.GetInfo(ctx)
		opts.Key = info.WorkflowExecution.RunID + "/" + info.ActivityID
	}
	res, err := h.Gate.Shed(ctx, in.Pool, opts)
	if err != nil {
		return ShedOutput{}, err
	}
	if len(res.IDs) == 0 {
		return ShedOutput{}, nil
	}
	n := h.Options.ShedNotifyConcurrency
	if n <= 0 {
		n = 16
	}
	slots := make(chan struct{}, n)
	var wg sync.WaitGroup
	var failed int
	var mu sync.Mutex
	for _, id := range res.IDs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := h.Notifier.NotifyShed(ctx, in.Pool, id); err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
				h.Logger.Warn("healing: tell a shed request", "pool", in.Pool, "requestID", id, "err", err)
			}
		})
	}
	wg.Wait()
	h.Logger.Warn("healing: shed the lowest tier's waiters", "pool", in.Pool, "weight", res.Weight,
		"shed", len(res.IDs), "notifyFailed", failed, "reason", in.Reason)
	h.Metrics.HealingAction(in.Pool, "shed")
	return ShedOutput{Shed: len(res.IDs), Weight: res.Weight}, nil
}

// Alert records a pool entering a worse state: a log line (an error when
// critical), sluice_healing_alerts_total, and a POST to the alert webhook
// if one is configured; a webhook that fails or answers non-2xx fails the
// activity, to be retried.
func (h *Healing) Alert(ctx context.Context, in AlertInput) error {
	attempt := int32(1)
	if activity.IsActivity(ctx) {
		attempt = activity.GetInfo(ctx).Attempt
	}
	if attempt == 1 {
		// Once per alert: a retry is for the webhook.
		level := slog.LevelWarn
		if in.Level == "critical" {
			level = slog.LevelError
		}
		hl := in.Health
		h.Logger.Log(ctx, level, "healing alert: "+in.Message, "pool", in.Pool, "level", in.Level,
			"ratio", hl.Ratio, "p50Ms", hl.P50Ms, "p99Ms", hl.P99Ms, "samples", hl.Samples,
			"queueDepth", hl.QueueDepth, "timeoutRate", hl.TimeoutRate, "kvCache", hl.KVCacheUsage, "backendWaiting", hl.BackendWaiting)
		h.Metrics.HealingAlert(in.Pool, in.Level)
	}
	err := h.Alerts.Send(ctx, alert.Alert{Pool: in.Pool, Level: in.Level, Message: in.Message, Health: in.Health})
	if errors.Is(err, alert.ErrInvalid) {
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeBadRequest, err)
	}
	return err
}
