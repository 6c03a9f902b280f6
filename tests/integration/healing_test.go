package integration

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"

	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/worker"
	"github.com/sluice-dev/sluice/workflows"
)

// The healer runs on the stack's worker against the real pools: it polls
// (its health activity reads Redis and the simulator), answers its query,
// and an override drives real actions — the long pool's permits are halved
// in the gate and given back when the pin comes down.
func TestHealingThroughTemporal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := stack.cfg
	cfg.Healing.Enabled = true
	cfg.Healing.Interval = time.Second
	cfg.Healing.Window, cfg.Healing.Cooldown = 3*time.Second, 3*time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// The stack is shared: requests earlier tests timed out on purpose are
	// still in the latency window and would read as a queue-timeout rate.
	forgetLatencyWindow(t, ctx)
	id := workflows.HealingWorkflowID(cfg.Temporal.TaskQueue)
	// The stack's own worker runs with healing off, and tells a healer to
	// stop once, when it starts, which may be after this test started one:
	// a healer it stopped is started again.
	for attempt := 0; ; attempt++ {
		if err := worker.StartHealing(ctx, stack.temporal, cfg, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * cfg.Healing.Interval)
		d, err := stack.temporal.DescribeWorkflow(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		if d.Status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
			break
		}
		if attempt == 2 {
			t.Fatalf("the healer keeps ending: %v", d.Status)
		}
	}
	t.Cleanup(func() {
		_ = stack.temporal.TerminateWorkflow(context.Background(), id, "", "test over")
		setPoolLimits(t, cfg.Pools.Short.MaxConcurrency, cfg.Pools.Long.MaxConcurrency)
	})
	status := func() workflows.HealingStatus {
		t.Helper()
		v, err := stack.temporal.QueryWorkflow(ctx, id, "", workflows.QueryHealing)
		if err != nil {
			t.Fatal(err)
		}
		var st workflows.HealingStatus
		if err := v.Get(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	waitFor := func(what string, ok func(workflows.HealingStatus) bool) workflows.HealingStatus {
		t.Helper()
		for {
			st := status()
			if ok(st) {
				return st
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: never; last status %+v", what, st)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	st := waitFor("two polls", func(s workflows.HealingStatus) bool { return s.Polls >= 2 })
	if len(st.Pools) != 2 || st.Pools[0].Level != workflows.LevelNormal {
		t.Fatalf("status %+v", st)
	}

	signal := func(name string, arg any) {
		t.Helper()
		if err := stack.temporal.SignalWorkflow(ctx, id, "", name, arg); err != nil {
			t.Fatal(err)
		}
	}
	longLimit := func() int {
		s, err := stack.gate.Stats(ctx, "long")
		if err != nil {
			t.Fatal(err)
		}
		return s.Limit
	}
	base := cfg.Pools.Long.MaxConcurrency
	signal(workflows.SignalOverride, workflows.OverrideSignal{Pool: "long", Level: workflows.LevelShrink})
	waitFor("the pin", func(s workflows.HealingStatus) bool {
		return s.Pools[1].Overridden && s.Pools[1].Level == workflows.LevelShrink
	})
	if got := longLimit(); got != max(base/2, 1) {
		t.Fatalf("long pool limit %d after shrinking, want %d", got, max(base/2, 1))
	}
	signal(workflows.SignalOverride, workflows.OverrideSignal{Pool: "long", Level: workflows.LevelNormal})
	waitFor("back to normal", func(s workflows.HealingStatus) bool { return s.Pools[1].Level == workflows.LevelNormal })
	if got := longLimit(); got != base {
		t.Fatalf("long pool limit %d after stepping back, want %d", got, base)
	}
	// A worker started with other settings hands them to the running
	// healer: the same run, one "settings" decision.
	currentRun := func() string {
		t.Helper()
		d, err := stack.temporal.DescribeWorkflow(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		return d.WorkflowExecution.RunID
	}
	runBefore := currentRun()
	cfg2 := cfg
	cfg2.Healing.HealthyPolls++
	if err := worker.StartHealing(ctx, stack.temporal, cfg2, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	waitFor("the new settings", func(s workflows.HealingStatus) bool {
		for _, d := range s.Decisions {
			if d.Action == "settings" {
				return true
			}
		}
		return false
	})
	if runAfter := currentRun(); runBefore == "" || runAfter != runBefore {
		t.Fatalf("a second worker's start replaced the healer's run %s with %s", runBefore, runAfter)
	}
	signal(workflows.SignalPause, nil)
	waitFor("paused", func(s workflows.HealingStatus) bool { return s.Paused })
	if testenv.RecordingHistories() {
		// Terminated first: a closed history replays to its end.
		if err := stack.temporal.TerminateWorkflow(ctx, id, "", "recorded"); err != nil {
			t.Fatal(err)
		}
		saveHistory(t, id, "healing_override_pause")
		return
	}

	// A worker started with healing disabled stops the healer, paused or
	// not: it undoes the shrink it applied, then ends.
	signal(workflows.SignalOverride, workflows.OverrideSignal{Pool: "long", Level: workflows.LevelShrink})
	waitFor("the pin again", func(s workflows.HealingStatus) bool { return s.Pools[1].Level == workflows.LevelShrink })
	off := cfg
	off.Healing.Enabled = false
	if err := worker.StartHealing(ctx, stack.temporal, off, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	var end workflows.HealingStatus
	if err := stack.temporal.GetWorkflow(ctx, id, "").Get(ctx, &end); err != nil {
		t.Fatalf("the stopped healer did not end: %v", err)
	}
	if got := longLimit(); got != base || end.Pools[1].Level != workflows.LevelNormal {
		t.Fatalf("after the stop: long pool limit %d at level %d, want %d at normal", got, end.Pools[1].Level, base)
	}
}

// forgetLatencyWindow deletes every series of the shared latency window.
func forgetLatencyWindow(t *testing.T, ctx context.Context) {
	t.Helper()
	iter := stack.redis.Scan(ctx, 0, keyPrefix+latency.Keyspace+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := stack.redis.Del(ctx, iter.Val()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
}
