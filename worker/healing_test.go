package worker

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/testsuite"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/workflows"
)

func TestHealingSettingsFromConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Pools.Short.Healing = config.PoolHealing{MinPermits: 2, BaseBatch: 16, MinBatch: 4, TTFTSLO: 2 * time.Second}
	cfg.Pools.Short.Scaler = config.Scaler{Kind: config.ScalerSimulator, URL: "http://sim:8090", BaseReplicas: 1, MaxReplicas: 4, Timeout: time.Second}
	cfg.Pools.Long.Scaler.MaxReplicas = 9 // ignored: kind none
	s := HealingSettings(cfg)
	if s.Interval != 10*time.Second || s.Window != 30*time.Second || s.Stage != "llm_first_token" || s.WarnRatio != 2 || s.CriticalRatio != 5 ||
		s.WarnKVCache != 0.75 || s.CriticalQueueDepth != 100 || s.CriticalTimeoutRate != 0.05 || s.MinSamples != 50 ||
		s.HealthyPolls != 3 || s.Cooldown != 30*time.Second || s.LongCostFactor != 2 || s.PollsPerRun != 500 {
		t.Fatalf("settings %+v", s)
	}
	want := []workflows.PoolBounds{
		{Pool: "short", BasePermits: 16, MinPermits: 2, BaseBatch: 16, MinBatch: 4, BaseReplicas: 1, MaxReplicas: 4, TTFTSLO: 2 * time.Second},
		{Pool: "long", BasePermits: 12, MinPermits: 1, BaseReplicas: 1, TTFTSLO: time.Minute},
	}
	if len(s.Pools) != 2 || s.Pools[0] != want[0] || s.Pools[1] != want[1] {
		t.Fatalf("pools %+v, want %+v", s.Pools, want)
	}
}

type fakeStarter struct {
	opts   client.StartWorkflowOptions
	name   any
	in     workflows.HealingInput
	signal string
	arg    any
	err    error
	// signalled is the workflow SignalWorkflow was sent to; signalErr is
	// its answer.
	signalled, signalledWith string
	signalErr                error
}

func (f *fakeStarter) SignalWorkflow(_ context.Context, id, _, signal string, _ any) error {
	f.signalled, f.signalledWith = id, signal
	return f.signalErr
}

func (f *fakeStarter) SignalWithStartWorkflow(_ context.Context, id, signal string, arg any, o client.StartWorkflowOptions, wf any, args ...any) (client.WorkflowRun, error) {
	f.opts, f.name, f.signal, f.arg = o, wf, signal, arg
	if len(args) == 1 {
		f.in, _ = args[0].(workflows.HealingInput)
	}
	if id != o.ID {
		return nil, errors.New("workflow ID differs from the options' ID")
	}
	if f.err != nil {
		return nil, f.err
	}
	return fakeRun{}, nil
}

type fakeRun struct{ client.WorkflowRun }

func (fakeRun) GetRunID() string { return "run-1" }

func TestStartHealingIsIdempotent(t *testing.T) {
	cfg := config.Default()
	logger := slog.New(slog.DiscardHandler)
	f := &fakeStarter{}
	if err := StartHealing(context.Background(), f, cfg, logger); err != nil {
		t.Fatal(err)
	}
	o := f.opts
	if o.ID != workflows.HealingWorkflowID(cfg.Temporal.TaskQueue) || o.TaskQueue != cfg.Temporal.TaskQueue ||
		o.WorkflowIDReusePolicy != enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE {
		t.Fatalf("start options %+v", o)
	}
	if f.name != workflows.HealingWorkflowName || f.in.State != nil || len(f.in.Settings.Pools) != 2 {
		t.Fatalf("started %v with %+v", f.name, f.in)
	}
	if set, ok := f.arg.(workflows.HealingSettings); f.signal != workflows.SignalSettings || !ok || set.Interval != cfg.Healing.Interval {
		t.Fatalf("signal %q %+v: want the worker's settings", f.signal, f.arg)
	}
	f.err = serviceerror.NewUnavailable("down")
	if err := StartHealing(context.Background(), f, cfg, logger); err == nil || !errors.As(err, new(*serviceerror.Unavailable)) {
		t.Fatalf("start error %v", err)
	}
	// Disabled: nothing starts, and a healer left running is told to stop.
	cfg.Healing.Enabled = false
	f = &fakeStarter{}
	if err := StartHealing(context.Background(), f, cfg, logger); err != nil || f.name != nil {
		t.Fatalf("disabled healer started: %v %v", f.name, err)
	}
	if f.signalled != workflows.HealingWorkflowID(cfg.Temporal.TaskQueue) || f.signalledWith != workflows.SignalStop {
		t.Fatalf("disabled: signalled %q with %q; want the healer told to stop", f.signalled, f.signalledWith)
	}
	f = &fakeStarter{signalErr: serviceerror.NewNotFound("no healer")}
	if err := StartHealing(context.Background(), f, cfg, logger); err != nil {
		t.Fatalf("disabled with no healer running: %v", err)
	}
}

// Healing's activities register next to the chat activities without a
// name colliding (a collision panics).
func TestHealingActivitiesRegisterBesideChat(t *testing.T) {
	env := (&testsuite.WorkflowTestSuite{}).NewTestWorkflowEnvironment()
	Register(env, &activities.Chat{}, &activities.Healing{})
}
