package worker

import (
	"context"
	"fmt"

	"go.temporal.io/api/workflowservice/v1"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/workflows"
)

// restartWatch notices a Redis that may have lost some of Sluice's
// queue: the process serving a pool's keys changed (a failover promoted a
// replica, or Redis restarted, empty or not). Queue places, grants and
// releases of the last moments — or all of them — may be gone, and a
// waiter does not re-check on its own (it waits for its grant's signal
// until its deadline), so the janitor that sees the change first asks
// every running chat request to look at its place once: waiters come
// back at their old places (their restore tokens keep the order) instead
// of waiting out their max wait. See admission.Gate.CheckServer.
type restartWatch struct {
	// seen: pools whose server this process has noted once, so that an
	// epoch found missing later means Redis lost it (not that this is the
	// first process ever to run against this Redis).
	seen map[string]bool
}

// checkRedisState notes which Redis process serves each pool and, when
// one changed or lost its keys, asks the running requests to re-check.
func (w *Worker) checkRedisState(ctx context.Context) {
	if w.restart.seen == nil {
		w.restart.seen = map[string]bool{}
	}
	var changed []string
	for _, pool := range w.gate.Pools() {
		id, err := w.gate.ServerOf(ctx, pool)
		if err != nil {
			continue // Redis unreachable: the pump's own warning says so
		}
		served, err := w.gate.CheckServer(ctx, pool, id)
		if err != nil {
			continue
		}
		if served == admission.ServedMoved || (served == admission.ServedLost && w.restart.seen[pool]) {
			changed = append(changed, pool+" "+served.String())
		}
		w.restart.seen[pool] = true
	}
	if len(changed) == 0 {
		return
	}
	w.logger.Warn("the Redis serving the admission queue changed (failover or restart): its last writes may be lost; asking running requests to re-check their queue places",
		"pools", changed)
	go func() {
		if n, err := w.requeueWaiters(ctx); err != nil {
			w.logger.Error("ask running requests to re-check", "asked", n, "err", err)
		} else {
			w.logger.Info("asked running requests to re-check", "asked", n)
		}
	}()
}

// requeueWaiters sends the recheck signal to every running chat request;
// those not waiting for a permit ignore it. It returns how many were
// asked.
func (w *Worker) requeueWaiters(ctx context.Context) (int, error) {
	query := fmt.Sprintf("WorkflowType = '%s' AND ExecutionStatus = 'Running'", workflows.ChatWorkflowName)
	var token []byte
	asked := 0
	for {
		resp, err := w.temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: w.cfg.Temporal.Namespace, Query: query, NextPageToken: token,
		})
		if err != nil {
			return asked, fmt.Errorf("list running chat requests: %w", err)
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for _, e := range resp.GetExecutions() {
			id := e.GetExecution().GetWorkflowId()
			g.Go(func() error {
				err := w.temporal.SignalWorkflow(gctx, id, "", workflows.SignalRecheck, workflows.RecheckSignal{Reason: "redis_state_lost"})
				if err != nil && !conn.NotFound(err) {
					w.logger.Warn("ask a request to re-check", "requestID", id, "err", err)
				}
				return nil
			})
			asked++
		}
		_ = g.Wait()
		if token = resp.GetNextPageToken(); len(token) == 0 {
			return asked, nil
		}
	}
}
