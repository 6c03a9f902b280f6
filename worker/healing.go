package worker

import (
	"context"
	"fmt"
	"log/slog"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/workflows"
)

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
