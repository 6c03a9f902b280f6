package workflows

import (
	"fmt"
	"slices"

	"go.temporal.io/sdk/workflow"
)

// The healer's signals: pause, resume, override a pool, new settings, stop.
// Each is taken between polls, and recorded as a decision.

func (h *healer) addSignals(ctx workflow.Context, sel workflow.Selector) {
	sel.AddReceive(h.pauseCh, func(c workflow.ReceiveChannel, _ bool) {
		c.Receive(ctx, nil)
		h.pause(ctx)
	})
	sel.AddReceive(h.resumeCh, func(c workflow.ReceiveChannel, _ bool) {
		c.Receive(ctx, nil)
		h.resume(ctx)
	})
	sel.AddReceive(h.overrideCh, func(c workflow.ReceiveChannel, _ bool) {
		var o OverrideSignal
		c.Receive(ctx, &o)
		h.override(ctx, o)
	})
	sel.AddReceive(h.settingsCh, func(c workflow.ReceiveChannel, _ bool) {
		var set HealingSettings
		c.Receive(ctx, &set)
		h.settings(ctx, set)
	})
	sel.AddReceive(h.stopCh, func(c workflow.ReceiveChannel, _ bool) {
		c.Receive(ctx, nil)
		h.stop(ctx)
	})
}

// drainSignals applies every signal already received. (Across the
// channels the order of arrival is not kept; within one it is.)
func (h *healer) drainSignals(ctx workflow.Context) {
	for {
		var o OverrideSignal
		var set HealingSettings
		switch {
		case h.pauseCh.ReceiveAsync(nil):
			h.pause(ctx)
		case h.resumeCh.ReceiveAsync(nil):
			h.resume(ctx)
		case h.overrideCh.ReceiveAsync(&o):
			h.override(ctx, o)
		case h.settingsCh.ReceiveAsync(&set):
			h.settings(ctx, set)
		case h.stopCh.ReceiveAsync(nil):
			h.stop(ctx)
		default:
			return
		}
	}
}

// settings takes new settings from the next poll on, and cancels a stop. Levels stay; pools
// at a level keep what was applied to them until they next change level,
// which then uses the new bounds. Settings equal to the current ones
// (every worker sends its own when it starts) change nothing.
func (h *healer) settings(ctx workflow.Context, set HealingSettings) {
	if h.st.Stopping {
		// Only workers with healing enabled send settings: one started
		// since the stop wants the healer.
		h.st.Stopping = false
		h.record(ctx, Decision{Action: "stop", Reason: "cancelled: a worker with healing enabled started"})
	}
	if sameSettings(set, h.set) {
		return
	}
	h.set = set
	h.st.Pools = reconcilePools(h.st.Pools, set)
	h.record(ctx, Decision{Action: "settings", Reason: fmt.Sprintf("%+v", set)})
}

// sameSettings compares field by field: reflect.DeepEqual is not allowed
// in workflow code, and a struct holding a slice has no ==.
// TestSameSettingsSeesEveryField fails when a field is left out here.
func sameSettings(a, b HealingSettings) bool {
	return a.Interval == b.Interval && a.Window == b.Window && a.Stage == b.Stage &&
		a.WarnRatio == b.WarnRatio && a.CriticalRatio == b.CriticalRatio && a.WarnKVCache == b.WarnKVCache &&
		a.CriticalQueueDepth == b.CriticalQueueDepth && a.CriticalTimeoutRate == b.CriticalTimeoutRate &&
		a.CriticalP99 == b.CriticalP99 && a.MinSamples == b.MinSamples && a.HealthyPolls == b.HealthyPolls &&
		a.Cooldown == b.Cooldown && a.LongCostFactor == b.LongCostFactor && a.PollsPerRun == b.PollsPerRun &&
		slices.Equal(a.Pools, b.Pools)
}

// stop turns the healer to stepping back: from the next poll it only
// undoes, and it ends once every pool is normal.
func (h *healer) stop(ctx workflow.Context) {
	if !h.st.Stopping {
		h.st.Stopping = true
		h.record(ctx, Decision{Action: "stop", Reason: "healing disabled: stepping every pool back"})
	}
}

func (h *healer) pause(ctx workflow.Context) {
	h.st.Paused = true
	h.record(ctx, Decision{Action: "pause"})
}

func (h *healer) resume(ctx workflow.Context) {
	h.st.Paused = false
	h.record(ctx, Decision{Action: "resume"})
}

// override pins a pool at a level, stepping through each level between so
// that every action applied is undone on the way back; Level -1 releases
// the pin (the healer then steps back by itself as the pool is healthy).
func (h *healer) override(ctx workflow.Context, o OverrideSignal) {
	for i := range h.st.Pools {
		p := &h.st.Pools[i]
		if p.Pool != o.Pool {
			continue
		}
		if o.Level < 0 {
			p.Overridden = false
			h.record(ctx, Decision{Pool: p.Pool, From: p.Level, To: p.Level, Action: "override", Reason: "released"})
			return
		}
		to := min(o.Level, maxLevel)
		p.Overridden = true
		h.record(ctx, Decision{Pool: p.Pool, From: p.Level, To: to, Action: "override", Reason: "pinned"})
		for p.Level != to {
			next := p.Level + 1
			if to < p.Level {
				next = p.Level - 1
			}
			if !h.step(ctx, i, next, "override") {
				return
			}
		}
		return
	}
	h.record(ctx, Decision{Pool: o.Pool, Action: "override", Reason: "unknown pool", Error: "no such pool"})
}
