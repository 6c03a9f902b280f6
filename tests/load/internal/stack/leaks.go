package stack

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/api/workflowservice/v1"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/workflows"
)

// What a scenario checks it left behind: permits still in use, places
// still in a queue, chat workflows still running.

// PoolState is one pool's permits in use and queue after a run.
type PoolState struct {
	Pool string
	admission.QueueStats
}

// WaitIdle reads every pool's state until all are idle or within has
// passed (with 0, once), and returns the last states and how long they
// took to be idle (-1: not within).
func WaitIdle(ctx context.Context, gate *admission.Gate, within time.Duration) ([]PoolState, time.Duration, error) {
	for t0 := time.Now(); ; {
		var states []PoolState
		idle := true
		for _, p := range gate.Pools() {
			qs, err := gate.QueueStats(ctx, p)
			if err != nil {
				return nil, -1, err
			}
			states = append(states, PoolState{p, qs})
			idle = idle && qs.InUse == 0 && qs.Waiting == 0
		}
		if idle {
			return states, time.Since(t0), nil
		}
		if time.Since(t0) > within || ctx.Err() != nil {
			return states, -1, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// LeftInPools adds a line per pool with linef (a report's) and returns
// the permits in use and queue places left in all of them.
func LeftInPools(linef func(format string, args ...any), states []PoolState) int {
	leaks := 0
	for _, s := range states {
		linef("pool %s afterwards: %d in use, %d waiting", s.Pool, s.InUse, s.Waiting)
		leaks += s.InUse + s.Waiting
	}
	return leaks
}

// RunningChatWorkflows waits up to within for no chat workflow to be
// running (visibility trails completion a little) and returns how many
// still are.
func RunningChatWorkflows(ctx context.Context, st *Stack, within time.Duration) (int64, error) {
	deadline := time.Now().Add(within)
	for {
		n, err := CountChatWorkflows(ctx, st, "ExecutionStatus = 'Running'")
		if err != nil {
			return 0, err
		}
		if n == 0 || time.Now().After(deadline) {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// CountChatWorkflows counts the chat workflows the server knows of that
// match a visibility condition ("" for all, open or closed).
func CountChatWorkflows(ctx context.Context, st *Stack, where string) (int64, error) {
	q := fmt.Sprintf("WorkflowType = '%s'", workflows.ChatWorkflowName)
	if where != "" {
		q += " AND " + where
	}
	resp, err := st.Core.Temporal.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{
		Namespace: st.Config.Temporal.Namespace, Query: q,
	})
	if err != nil {
		return 0, fmt.Errorf("count chat workflows (%s): %w", q, err)
	}
	return resp.GetCount(), nil
}
