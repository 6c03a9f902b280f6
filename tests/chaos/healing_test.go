package chaos

import (
	"context"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// The whole stack restarted with healing.enabled: false stops the healer
// the last run left running — the dev server keeps it in its database —
// and gives the pools back their configured permits: the API and the
// worker stop, the dev server restarts on its file, and the new processes
// start with healing off. Before, the old healer went on acting.
func testHealingOffAcrossRestart(t *testing.T) {
	slow(t)
	s := startStack(t, stackOptions{externalWorker: true, configure: func(c *config.Config) {
		c.Healing.Enabled = true
		c.Healing.Interval = time.Second
		c.Healing.Window, c.Healing.Cooldown = 3*time.Second, 3*time.Second
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := workflows.HealingWorkflowID(s.cfg.Temporal.TaskQueue)
	base := s.cfg.Pools.Long.MaxConcurrency
	longLimit := func() int {
		st, err := s.gate.Stats(ctx, request.PoolLong)
		if err != nil {
			t.Fatal(err)
		}
		return st.Limit
	}
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			if ctx.Err() != nil {
				t.Fatalf("%s: never", what)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// A person pins the long pool at shrink: its permits are halved.
	waitUntil("the healer running", func() bool {
		d, err := s.tc.DescribeWorkflow(ctx, id, "")
		return err == nil && d.Status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING
	})
	if err := s.tc.SignalWorkflow(ctx, id, "", workflows.SignalOverride, workflows.OverrideSignal{Pool: request.PoolLong, Level: workflows.LevelShrink}); err != nil {
		t.Fatal(err)
	}
	waitUntil("the long pool shrunk", func() bool { return longLimit() == max(base/2, 1) })

	// The whole stack down, then up again with healing off.
	if err := s.api.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	s.api = nil
	s.worker.Stop()
	if err := s.temporal.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.temporal.Start(ctx); err != nil {
		t.Fatal(err)
	}
	s.cfg.Healing.Enabled = false
	s.worker = newWorkerProcess(t, s.cfg)
	if err := s.worker.Start(); err != nil {
		t.Fatal(err)
	}
	s.startAPI(ctx)

	var end workflows.HealingStatus
	if err := s.tc.GetWorkflow(ctx, id, "").Get(ctx, &end); err != nil {
		t.Fatalf("the healer did not end after the restart with healing off: %v", err)
	}
	if got := longLimit(); got != base || end.Pools[1].Level != workflows.LevelNormal {
		t.Fatalf("after the restart: long pool limit %d at level %d, want %d at normal", got, end.Pools[1].Level, base)
	}
	if err := s.waitReady(ctx); err != nil {
		t.Fatal(err)
	}
}
