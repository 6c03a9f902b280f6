package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dev/sluice/workflows"
)

// restartWatch notices a Redis that lost Sluice's state — it restarted
// empty, or was flushed — by a sentinel key that the first janitor to
// find it missing writes again. Every queue place was lost with it, and a
// waiter does not re-check on its own (it waits for its grant's signal
// until its deadline), so the janitor that wrote the sentinel asks every
// running chat request to look at its place once: waiters come back at
// their old places (their restore tokens keep the order) instead of
// waiting out their max wait.
type restartWatch struct {
	// seen: the sentinel was read or written once by this process, so a
	// missing one later means Redis lost it (not that this is the first
	// process ever to run against this Redis).
	seen bool
}

// sentinelKey is the key whose absence says Redis lost its state.
func (r *Runtime) sentinelKey() string { return r.Config.Redis.KeyPrefix + "adm:epoch" }

// checkRedisState writes the sentinel if it is missing and, if this
// process had seen it before, asks the running requests to re-check.
func (r *Runtime) checkRedisState(ctx context.Context) {
	created, err := r.Redis.SetNX(ctx, r.sentinelKey(), strconv.FormatInt(time.Now().UnixNano(), 36), 0).Result()
	if err != nil {
		return // Redis unreachable: the pump's own warning says so
	}
	if created && r.restart.seen {
		r.Logger.Warn("Redis lost Sluice's state (restarted empty?); asking running requests to re-check their queue places")
		go func() {
			if n, err := r.requeueWaiters(ctx); err != nil {
				r.Logger.Error("ask running requests to re-check", "asked", n, "err", err)
			} else {
				r.Logger.Info("asked running requests to re-check", "asked", n)
			}
		}()
	}
	r.restart.seen = true
}

// requeueWaiters sends the recheck signal to every running chat request;
// those not waiting for a permit ignore it. It returns how many were
// asked.
func (r *Runtime) requeueWaiters(ctx context.Context) (int, error) {
	query := fmt.Sprintf("WorkflowType = '%s' AND ExecutionStatus = 'Running'", workflows.ChatWorkflowName)
	var token []byte
	asked := 0
	for {
		resp, err := r.Temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: r.Config.Temporal.Namespace, Query: query, NextPageToken: token,
		})
		if err != nil {
			return asked, fmt.Errorf("list running chat requests: %w", err)
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for _, e := range resp.GetExecutions() {
			id := e.GetExecution().GetWorkflowId()
			g.Go(func() error {
				err := r.Temporal.SignalWorkflow(gctx, id, "", workflows.SignalRecheck, workflows.RecheckSignal{Reason: "redis_state_lost"})
				if err != nil && !isNotFound(err) {
					r.Logger.Warn("ask a request to re-check", "requestID", id, "err", err)
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

// isNotFound reports a workflow that is gone.
func isNotFound(err error) bool {
	var nf *serviceerror.NotFound
	return errors.As(err, &nf)
}
