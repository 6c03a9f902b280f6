package worker

import (
	"context"
	"fmt"
	"log/slog"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/alert"
	"github.com/sluice-dev/sluice/pkg/backend"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/scaler"
	"github.com/sluice-dev/sluice/workflows"
	"github.com/sluice-dev/sluice/workflows/signal"
)

// NewScaler builds a pool's scaler from config; nil for kind none.
func NewScaler(pool string, s config.Scaler, logger *slog.Logger) (scaler.Scaler, error) {
	var sc scaler.Scaler
	var err error
	switch s.Kind {
	case config.ScalerNone:
		return nil, nil
	case config.ScalerSimulator:
		sc, err = scaler.NewSimulator(scaler.SimulatorOptions{URL: s.URL, Timeout: s.Timeout, Logger: logger})
	case config.ScalerWebhook:
		sc, err = scaler.NewWebhook(scaler.WebhookOptions{URL: s.URL, StatusURL: s.StatusURL, Pool: pool, Token: s.Token, Timeout: s.Timeout, Logger: logger})
	case config.ScalerKubernetes:
		sc, err = scaler.NewKubernetes(scaler.KubernetesOptions{APIServer: s.APIServer, Namespace: s.Namespace, Deployment: s.Deployment, Timeout: s.Timeout, Logger: logger})
	default:
		return nil, fmt.Errorf("pools.%s.scaler.kind: unknown kind %q", pool, s.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("pools.%s.scaler: %w", pool, err)
	}
	return sc, nil
}

// buildHealing wires the healer's activities from config.
func (r *Runtime) buildHealing() (*activities.Healing, error) {
	cfg := r.Config
	pools := map[string]activities.HealingPool{}
	for name, p := range cfg.Pools.ByName() {
		sc, err := NewScaler(name, p.Scaler, r.Logger.With("component", "scaler", "pool", name))
		if err != nil {
			return nil, err
		}
		endpoints := make([]string, len(p.Endpoints))
		for i, e := range p.Endpoints {
			endpoints[i] = backend.Base(e)
		}
		hp := activities.HealingPool{
			Endpoints: endpoints, MinPermits: p.Healing.MinPermits, MaxPermits: p.MaxConcurrency,
			Scaler: sc, MinReplicas: p.Scaler.BaseReplicas, MaxReplicas: p.Scaler.MaxReplicas,
		}
		if cr, ok := r.Chat.Pools[name].Streamer.(interface{ Circuits() []llm.Circuit }); ok {
			hp.Circuits = cr.Circuits
		}
		if p.Healing.BaseBatch > 0 {
			hp.MinBatch, hp.MaxBatch = p.Healing.MinBatch, p.Healing.BaseBatch
		}
		pools[name] = hp
	}
	return &activities.Healing{
		Gate:     r.Gate,
		Latency:  r.Latency,
		Policy:   r.Policy,
		Pools:    pools,
		Notifier: signal.Notifier{Client: r.Temporal},
		Metrics:  r.Metrics,
		Backends: backend.Client{Timeout: cfg.Healing.MetricsTimeout},
		Alerts:   alert.Webhook{URL: cfg.Healing.AlertWebhook, Timeout: cfg.Healing.AlertTimeout},
		Logger:   r.Logger.With("component", "healing"),
	}, nil
}

// HealingStarter is the part of the Temporal client StartHealing needs.
type HealingStarter interface {
	SignalWithStartWorkflow(ctx context.Context, workflowID, signalName string, signalArg any,
		options client.StartWorkflowOptions, workflow any, workflowArgs ...any) (client.WorkflowRun, error)
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
}

// StartHealing starts the deployment's healing workflow when
// healing.enabled, idempotently: every worker calls it, and the one run
// under workflows.HealingWorkflowID stays (a run already going is used as
// is; one that ended, whatever way, is replaced). Either way the run gets
// this worker's settings by signal, so a config change rolled out with
// the workers reaches a running healer (levels and state are kept).
// With healing disabled it starts nothing and stops a healer left
// running (by an earlier start with it enabled: the dev server keeps its
// database across `make run`s): the healer undoes what it applied, then
// ends. Terminating it instead would leave its pools throttled.
func StartHealing(ctx context.Context, c HealingStarter, cfg config.Config, logger *slog.Logger) error {
	id := workflows.HealingWorkflowID(cfg.Temporal.TaskQueue)
	if !cfg.Healing.Enabled {
		err := c.SignalWorkflow(ctx, id, "", workflows.SignalStop, nil)
		switch {
		case conn.NotFound(err):
			logger.Info("healing disabled (healing.enabled); not starting the healer", "workflowID", id)
		case err != nil:
			return fmt.Errorf("stop healing workflow %s: %w", id, err)
		default:
			logger.Info("healing disabled (healing.enabled); the running healer steps every pool back, then ends", "workflowID", id)
		}
		return nil
	}
	set := HealingSettings(cfg)
	run, err := c.SignalWithStartWorkflow(ctx, id, workflows.SignalSettings, set, client.StartWorkflowOptions{
		ID:                    id,
		TaskQueue:             cfg.Temporal.TaskQueue,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
	}, workflows.HealingWorkflowName, workflows.HealingInput{Settings: set})
	if err != nil {
		return fmt.Errorf("start healing workflow %s: %w", id, err)
	}
	logger.Info("healing workflow running", "workflowID", id, "runID", run.GetRunID())
	return nil
}
