package workflows

import (
	"fmt"
	"math"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/request"
)

// hact names the healing activities for the workflow, as a names the chat
// activities; the constants name them in decisions (and in tests).
var hact *activities.Healing

// Healing activity names (methods of activities.Healing).
const (
	actReadHealth   = "ReadHealth"
	actSetPermits   = "SetPermits"
	actSetBatch     = "SetBatch"
	actThrottleLong = "ThrottleLong"
	actScale        = "Scale"
	actShed         = "Shed"
	actAlert        = "Alert"
)

// maxDecisions is how many recent decisions the state keeps.
const maxDecisions = 50

// maxHoldFactor bounds how far flapping stretches a pool's hold before it
// steps back, as a multiple of HealthyPolls.
const maxHoldFactor = 8

// HealingWorkflow watches every pool's tail and acts on it, one level at a
// time, the cheapest and most easily undone first — shrink the batch,
// throttle long requests, scale out, shed the lowest tier — and steps
// back, one level at a time, once a pool has been healthy for a while.
// Every action is an activity, so the Temporal UI shows each with its
// inputs; every decision is kept in the state its query returns.
func HealingWorkflow(ctx workflow.Context, in HealingInput) (HealingStatus, error) {
	h := &healer{set: in.Settings, st: initialState(in)}
	if err := h.setup(ctx); err != nil {
		return HealingStatus{}, err
	}
	return h.run(ctx)
}

type healer struct {
	set    HealingSettings
	st     HealingState
	logger log.Logger

	pauseCh, resumeCh, overrideCh, settingsCh, stopCh workflow.ReceiveChannel
}

// initialState is the carried-over state, reconciled with the pools of the
// current settings.
func initialState(in HealingInput) HealingState {
	var st HealingState
	if in.State != nil {
		st = *in.State
	}
	st.Pools = reconcilePools(st.Pools, in.Settings)
	return st
}

// reconcilePools keeps the state of the pools set still has, in its order
// (what was applied to them stays until they next change level); a pool
// new to it starts at its baseline.
func reconcilePools(pools []PoolState, set HealingSettings) []PoolState {
	old := map[string]PoolState{}
	for _, p := range pools {
		old[p.Pool] = p
	}
	out := make([]PoolState, 0, len(set.Pools))
	for _, b := range set.Pools {
		p, ok := old[b.Pool]
		if !ok {
			p.Pool, p.Permits, p.Batch, p.Replicas = b.Pool, b.BasePermits, b.BaseBatch, b.BaseReplicas
		}
		out = append(out, p)
	}
	return out
}

func (h *healer) setup(ctx workflow.Context) error {
	h.logger = workflow.GetLogger(ctx)
	h.pauseCh = workflow.GetSignalChannel(ctx, SignalPause)
	h.resumeCh = workflow.GetSignalChannel(ctx, SignalResume)
	h.overrideCh = workflow.GetSignalChannel(ctx, SignalOverride)
	h.settingsCh = workflow.GetSignalChannel(ctx, SignalSettings)
	h.stopCh = workflow.GetSignalChannel(ctx, SignalStop)
	return workflow.SetQueryHandler(ctx, QueryHealing, func() (HealingStatus, error) {
		return h.status(), nil
	})
}

func (h *healer) status() HealingStatus {
	return HealingStatus{
		Paused: h.st.Paused, Polls: h.st.Polls,
		Pools:     append([]PoolState(nil), h.st.Pools...),
		Decisions: append([]Decision(nil), h.st.Decisions...),
	}
}

func (h *healer) run(ctx workflow.Context) (HealingStatus, error) {
	for polls := 0; ; polls++ {
		if polls >= max(h.set.PollsPerRun, 1) || workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			// Signals already delivered belong to this run's history:
			// apply them before handing the state on.
			h.drainSignals(ctx)
			st := h.st
			return HealingStatus{}, workflow.NewContinueAsNewError(ctx, HealingWorkflowName, HealingInput{Settings: h.set, State: &st})
		}
		h.st.Polls++
		if h.st.Stopping && h.stepBackAll(ctx) {
			h.record(ctx, Decision{Action: "stop", Reason: "every pool back to normal"})
			return h.status(), nil
		}
		if !h.st.Stopping {
			h.poll(ctx)
		}
		h.wait(ctx, h.set.Interval)
		if err := ctx.Err(); err != nil {
			return h.status(), err
		}
	}
}

// stepBackAll moves every pool above normal one level down, overrides
// and pauses notwithstanding, and reports whether all are normal now. A
// step whose action failed is tried again the next poll: a pool is never
// left throttled by a healer that has gone.
func (h *healer) stepBackAll(ctx workflow.Context) bool {
	done := true
	for i := range h.st.Pools {
		p := &h.st.Pools[i]
		p.Overridden = false
		if p.Level > LevelNormal {
			h.step(ctx, i, p.Level-1, "healing stopped")
		}
		done = done && p.Level == LevelNormal
	}
	return done
}

// poll reads every pool's health and decides for each.
func (h *healer) poll(ctx workflow.Context) {
	names := make([]string, len(h.st.Pools))
	levels := make(map[string]int, len(h.st.Pools))
	for i, p := range h.st.Pools {
		names[i] = p.Pool
		levels[p.Pool] = p.Level
	}
	var out activities.HealthOutput
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 2},
	})
	err := workflow.ExecuteActivity(actx, hact.ReadHealth, activities.HealthInput{
		Pools: names, Stage: h.set.Stage, Window: h.set.Window, Levels: levels, Interval: h.set.Interval,
	}).Get(actx, &out)
	if err != nil {
		// Blind, the healer does nothing: no signal is not a healthy one.
		h.logger.Warn("read health failed", "error", err)
		return
	}
	byPool := map[string]activities.PoolHealth{}
	for _, ph := range out.Pools {
		byPool[ph.Pool] = ph
	}
	for i := range h.st.Pools {
		if ph, ok := byPool[h.st.Pools[i].Pool]; ok {
			h.decide(ctx, i, ph)
		}
	}
}

// classify says how bad a pool is: "critical", "warn" or "" (healthy),
// why, and the cause of a critical: causeTail (its backends' tail),
// causeQueue (depth or queue timeouts while the tail is not critical: the
// pool is starved, it lacks permits rather than has too many) or
// causeBackends (every circuit open).
func (h *healer) classify(ph activities.PoolHealth) (string, string, string) {
	tail := ph.Samples >= h.set.MinSamples
	switch {
	case tail && h.set.CriticalP99 > 0 && ph.P99Ms > float64(h.set.CriticalP99.Milliseconds()):
		return "critical", fmt.Sprintf("P99 %.0f ms > %s (P50 %.0f ms, %d samples)", ph.P99Ms, h.set.CriticalP99, ph.P50Ms, ph.Samples), causeTail
	case tail && ph.Ratio > h.set.CriticalRatio:
		return "critical", fmt.Sprintf("P99/P50 %.1f > %.1f (P50 %.0f ms, P99 %.0f ms, %d samples)", ph.Ratio, h.set.CriticalRatio, ph.P50Ms, ph.P99Ms, ph.Samples), causeTail
	case ph.QueueDepth > h.set.CriticalQueueDepth:
		return "critical", fmt.Sprintf("queue depth %d > %d", ph.QueueDepth, h.set.CriticalQueueDepth), causeQueue
	case ph.Requests > 0 && ph.TimeoutRate > h.set.CriticalTimeoutRate:
		return "critical", fmt.Sprintf("queue timeout rate %.1f%% > %.1f%%", 100*ph.TimeoutRate, 100*h.set.CriticalTimeoutRate), causeQueue
	case ph.Endpoints > 0 && ph.Ejected >= ph.Endpoints:
		// Requests fail fast with backend_unavailable; more replicas are
		// what brings the pool back.
		return "critical", fmt.Sprintf("all %d backends ejected by their circuit breakers", ph.Endpoints), causeBackends
	case tail && ph.Ratio > h.set.WarnRatio:
		return "warn", fmt.Sprintf("P99/P50 %.1f > %.1f", ph.Ratio, h.set.WarnRatio), ""
	case ph.KVCacheUsage > h.set.WarnKVCache:
		return "warn", fmt.Sprintf("KV cache %.0f%% > %.0f%%", 100*ph.KVCacheUsage, 100*h.set.WarnKVCache), ""
	case ph.Ejected > 0:
		// The others take its share; worth a look, not yet an action.
		return "warn", fmt.Sprintf("%d of %d backends ejected by their circuit breakers", ph.Ejected, ph.Endpoints), ""
	}
	return "", "healthy", ""
}

// Causes of a critical pool (classify).
const (
	causeTail     = "tail"
	causeQueue    = "queue"
	causeBackends = "backends"
)

// clientsServed says whether pool p, critical for its backends' tail, is
// serving its clients within their first-token promise all the same (its
// TTFTSLO, against the P99 of the ttft series: from the request, the
// queue included): then cutting it would cost other clients and give its
// own nothing, and the healer holds. Runs that began before this rule (no
// version marker) act on the tail alone.
func (h *healer) clientsServed(ctx workflow.Context, p *PoolState, ph activities.PoolHealth, cause string) bool {
	if workflow.GetVersion(ctx, versionClientSLO, workflow.DefaultVersion, 1) < 1 {
		return false
	}
	slo := h.bounds(p.Pool).TTFTSLO
	return cause == causeTail && slo > 0 && ph.TTFTSamples >= h.set.MinSamples && ph.TTFTP99Ms <= float64(slo.Milliseconds())
}

// versionClientSLO marks the change that holds a pool whose clients are
// served within their first-token promise.
const versionClientSLO = "heal-by-client-slo"

// spares says whether the healer must spare pool p the cut a level would
// make to its own capacity: p is starved (classify), and cutting it would
// answer its starvation by starving it further. Runs that began before
// this rule (no version marker) cut as they did.
func (h *healer) spares(ctx workflow.Context, p *PoolState) bool {
	return p.Starved && workflow.GetVersion(ctx, versionSpareStarved, workflow.DefaultVersion, 1) >= 1
}

// versionSpareStarved marks the change that spares starved pools.
const versionSpareStarved = "spare-starved-pools"

var alertRank = map[string]int{"": 0, "warn": 1, "critical": 2}

// decide moves pool i at most one level: up when critical and its
// cool-down has passed, down when it has been healthy for HealthyPolls
// polls in a row (and its cool-down has passed); a pool in the warn zone
// holds its level, which is the hysteresis between the two thresholds.
func (h *healer) decide(ctx workflow.Context, i int, ph activities.PoolHealth) {
	p := &h.st.Pools[i]
	state, why, cause := h.classify(ph)
	if state == "critical" && h.clientsServed(ctx, p, ph, cause) {
		state, why = "warn", fmt.Sprintf("%s, but clients' TTFT P99 %.0f ms is within %s: holding", why, ph.TTFTP99Ms, h.bounds(p.Pool).TTFTSLO)
	}
	if alertRank[state] > alertRank[p.Alert] {
		h.exec(ctx, actAlert, activities.AlertInput{Pool: p.Pool, Level: state, Message: why, Health: ph}, nil)
	}
	p.Alert = state
	if state == "" {
		p.HealthyStreak++
	} else {
		p.HealthyStreak = 0
	}
	if h.st.Paused || p.Overridden {
		return
	}
	now := workflow.Now(ctx)
	cooled := p.LastChange.IsZero() || now.Sub(p.LastChange) >= h.set.Cooldown
	switch {
	case state == "critical" && cooled && p.Level < maxLevel:
		p.Starved = cause == causeQueue
		h.step(ctx, i, p.Level+1, why)
	case state == "critical" && cooled && p.Level == LevelShed:
		// At the top, shedding is what is left to do, once per cool-down.
		if h.shed(ctx, i, why) {
			p.LastChange = now
		}
	case state == "" && p.Level > LevelNormal && p.HealthyStreak >= h.hold(p) && cooled:
		h.step(ctx, i, p.Level-1, fmt.Sprintf("healthy for %d polls", p.HealthyStreak))
		p.HealthyStreak = 0
	case state == "" && p.Level == LevelNormal && (p.Hold > 0 || p.SteppedBack) && p.HealthyStreak >= h.hold(p):
		// Stable at the baseline for a whole hold: no flapping (any more);
		// a later escalation is a new episode.
		p.Hold, p.SteppedBack = 0, false
	}
}

// hold is how many healthy polls in a row step pool p back.
func (h *healer) hold(p *PoolState) int {
	return max(p.Hold, h.set.HealthyPolls, 1)
}

// step moves pool i one level up or down: entering a level applies its
// action, leaving one undoes it. The level changes only if the action
// succeeded; otherwise the next poll tries again.
func (h *healer) step(ctx workflow.Context, i, to int, why string) bool {
	p := &h.st.Pools[i]
	from := p.Level
	var ok bool
	if to > from {
		ok = h.enter(ctx, i, to, why)
	} else {
		ok = h.leave(ctx, i, from, why)
	}
	if ok {
		p.Level = to
		p.LastChange = workflow.Now(ctx)
		h.record(ctx, Decision{Pool: p.Pool, From: from, To: to, Action: "level", Reason: why})
		h.damping(p, to > from)
	}
	return ok
}

// damping doubles p's hold when it escalates right after stepping back:
// the healer stepped back too early, and without a longer hold would go
// round the same loop (step back, tail returns, escalate) forever.
func (h *healer) damping(p *PoolState, up bool) {
	if p.Overridden {
		return
	}
	if up && p.SteppedBack {
		p.Hold = min(2*h.hold(p), maxHoldFactor*max(h.set.HealthyPolls, 1))
	}
	p.SteppedBack = !up
}

func (h *healer) bounds(pool string) PoolBounds {
	for _, b := range h.set.Pools {
		if b.Pool == pool {
			return b
		}
	}
	return PoolBounds{Pool: pool}
}

// enter applies level's action to pool i.
func (h *healer) enter(ctx workflow.Context, i, level int, why string) bool {
	p := &h.st.Pools[i]
	b := h.bounds(p.Pool)
	switch level {
	case LevelShrink:
		if h.spares(ctx, p) {
			// Fewer permits or a smaller batch would lengthen the queue
			// that made it critical; the next levels add capacity or shed.
			h.record(ctx, Decision{Pool: p.Pool, From: p.Level, To: level, Action: actSetPermits, Reason: "skipped: the pool is starved (" + why + "), not its backends"})
			return true
		}
		permits := h.permits(i, i, level)
		if !h.act(ctx, p, level, actSetPermits, activities.SetPermitsInput{Pool: p.Pool, Permits: permits, Reason: why}, nil) {
			return false
		}
		p.Permits = permits
		if b.BaseBatch > 0 {
			batch := max(b.MinBatch, b.BaseBatch/2, 1)
			var out activities.SetBatchOutput
			// A backend that cannot change its batch leaves the permits as
			// the batch control: not a reason to stay.
			if h.act(ctx, p, level, actSetBatch, activities.SetBatchInput{Pool: p.Pool, MaxNumSeqs: batch, Reason: why}, &out) {
				p.Batch = batch
			}
		}
		return true
	case LevelThrottle:
		if p.Pool == request.PoolLong && h.spares(ctx, p) {
			// Throttling long requests would charge the starved pool's own
			// requests more and cap its permits.
			h.record(ctx, Decision{Pool: p.Pool, From: p.Level, To: level, Action: actThrottleLong, Reason: "skipped: the long pool is starved (" + why + ")"})
			return true
		}
		if !h.act(ctx, p, level, actThrottleLong, activities.ThrottleLongInput{CostFactor: max(h.set.LongCostFactor, 1), Reason: why}, nil) {
			return false
		}
		return h.applyLongPermits(ctx, i, level, why)
	case LevelScale:
		if b.MaxReplicas <= 0 {
			h.record(ctx, Decision{Pool: p.Pool, From: p.Level, To: level, Action: actScale, Reason: "skipped: the pool has no scaler"})
			return true
		}
		replicas := min(b.MaxReplicas, b.BaseReplicas+max(1, b.BaseReplicas/2))
		if !h.act(ctx, p, level, actScale, activities.ScaleInput{Pool: p.Pool, Replicas: replicas, Reason: why}, nil) {
			return false
		}
		p.Replicas = replicas
		return true
	case LevelShed:
		return h.shed(ctx, i, why)
	}
	return false
}

// leave undoes level's action on pool i.
func (h *healer) leave(ctx workflow.Context, i, level int, why string) bool {
	p := &h.st.Pools[i]
	b := h.bounds(p.Pool)
	switch level {
	case LevelShed:
		return true // shedding is done once; nothing stays applied
	case LevelScale:
		if b.MaxReplicas <= 0 {
			return true
		}
		if !h.act(ctx, p, level-1, actScale, activities.ScaleInput{Pool: p.Pool, Replicas: b.BaseReplicas, Reason: why}, nil) {
			return false
		}
		p.Replicas = b.BaseReplicas
		return true
	case LevelThrottle:
		// Throttling is global: it stays while another pool needs it.
		for j, o := range h.st.Pools {
			if j != i && o.Level >= LevelThrottle {
				return true
			}
		}
		if !h.act(ctx, p, level-1, actThrottleLong, activities.ThrottleLongInput{CostFactor: 1, Reason: why}, nil) {
			return false
		}
		return h.applyLongPermits(ctx, i, level-1, why)
	case LevelShrink:
		permits := h.permits(i, i, level-1)
		if !h.act(ctx, p, level-1, actSetPermits, activities.SetPermitsInput{Pool: p.Pool, Permits: permits, Reason: why}, nil) {
			return false
		}
		p.Permits = permits
		if b.BaseBatch > 0 {
			var out activities.SetBatchOutput
			if h.act(ctx, p, level-1, actSetBatch, activities.SetBatchInput{Pool: p.Pool, MaxNumSeqs: b.BaseBatch, Reason: why}, &out) {
				p.Batch = b.BaseBatch
			}
		}
		return true
	}
	return false
}

// permits is what pool k may hold once pool i is at level (the state
// still has i's old level): its base, halved from shrink up (never below
// its minimum). The long pool is also capped while any pool is at
// throttle or above, at its base divided by LongCostFactor: throttling
// long requests must mean fewer long sequences in the batch and KV cache
// the pools share, which a token charge alone does not give where no token
// limit binds.
func (h *healer) permits(k, i, level int) int {
	levelOf := func(j int) int {
		if j == i {
			return level
		}
		return h.st.Pools[j].Level
	}
	b := h.bounds(h.st.Pools[k].Pool)
	n := b.BasePermits
	if levelOf(k) >= LevelShrink {
		n = max(b.MinPermits, b.BasePermits/2, 1)
	}
	if b.Pool != request.PoolLong {
		return n
	}
	for j := range h.st.Pools {
		if levelOf(j) >= LevelThrottle {
			f := max(h.set.LongCostFactor, 1)
			return min(n, max(b.MinPermits, int(math.Ceil(float64(b.BasePermits)/f)), 1))
		}
	}
	return n
}

// applyLongPermits sets the long pool's permits to what they must be once
// pool i is at level: throttling changes them whichever pool throttles.
func (h *healer) applyLongPermits(ctx workflow.Context, i, level int, why string) bool {
	for k := range h.st.Pools {
		lp := &h.st.Pools[k]
		if lp.Pool != request.PoolLong {
			continue
		}
		n := h.permits(k, i, level)
		if n == lp.Permits {
			return true
		}
		if !h.act(ctx, lp, lp.Level, actSetPermits, activities.SetPermitsInput{Pool: lp.Pool, Permits: n, Reason: why}, nil) {
			return false
		}
		lp.Permits = n
	}
	return true
}

func (h *healer) shed(ctx workflow.Context, i int, why string) bool {
	p := &h.st.Pools[i]
	var out activities.ShedOutput
	if !h.act(ctx, p, LevelShed, actShed, activities.ShedInput{Pool: p.Pool, Reason: why}, &out) {
		return false
	}
	h.logger.Info("shed waiting requests", "pool", p.Pool, "shed", out.Shed)
	return true
}

// act runs one action and records it as a decision.
func (h *healer) act(ctx workflow.Context, p *PoolState, to int, name string, in, out any) bool {
	err := h.exec(ctx, name, in, out)
	d := Decision{Pool: p.Pool, From: p.Level, To: to, Action: name, Reason: fmt.Sprintf("%+v", in)}
	if err != nil {
		d.Error = err.Error()
	}
	h.record(ctx, d)
	return err == nil
}

// exec runs one healing activity with bounded retries: an action that
// keeps failing is tried again at the next poll, not forever now.
func (h *healer) exec(ctx workflow.Context, name string, in, out any) error {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, MaximumAttempts: 3,
		},
	})
	err := workflow.ExecuteActivity(actx, healingActivity(name), in).Get(actx, out)
	if err != nil {
		h.logger.Warn("healing action failed", "action", name, "error", err)
	}
	return err
}

// healingActivity is the activity method of a name.
func healingActivity(name string) any {
	switch name {
	case actSetPermits:
		return hact.SetPermits
	case actSetBatch:
		return hact.SetBatch
	case actThrottleLong:
		return hact.ThrottleLong
	case actScale:
		return hact.Scale
	case actShed:
		return hact.Shed
	case actAlert:
		return hact.Alert
	}
	return name
}

func (h *healer) record(ctx workflow.Context, d Decision) {
	d.At = workflow.Now(ctx)
	h.st.Decisions = append(h.st.Decisions, d)
	if n := len(h.st.Decisions); n > maxDecisions {
		h.st.Decisions = append([]Decision(nil), h.st.Decisions[n-maxDecisions:]...)
	}
	h.logger.Info("healing decision", "pool", d.Pool, "from", d.From, "to", d.To, "action", d.Action, "reason", d.Reason, "error", d.Error)
}

// wait sleeps until the next poll, handling signals as they come.
func (h *healer) wait(ctx workflow.Context, d time.Duration) {
	timer := workflow.NewTimer(ctx, d)
	for fired := false; !fired; {
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(timer, func(workflow.Future) { fired = true })
		h.addSignals(ctx, sel)
		sel.Select(ctx)
	}
}
