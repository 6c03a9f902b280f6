// Package liveness ends the event streams of requests whose workflow
// ended without writing their end, or vanished, so that the clients
// following them hear an error within seconds instead of keep-alives
// forever (see Sweeper).
package liveness

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// livenessInterval is how often the process looks for followed requests
// whose workflow is gone. A stream that waits on a workflow that no longer
// exists would otherwise wait for events that never come.
const livenessInterval = 2 * time.Second

// closedLookBack widens each search for closed workflows past the last
// one, for visibility records written late.
const closedLookBack = 10 * time.Second

// sweepConcurrency bounds the describes of a sweep.
const sweepConcurrency = 8

// Sweeper ends the event streams of requests whose workflow ended
// without writing their end (terminated by an operator, timed out, or
// failed) or vanished (a Temporal server that lost its state), so that
// their clients get an error event within seconds instead of keep-alives
// forever. It costs Temporal two calls per interval per API process,
// whatever the number of streams: a search for chat workflows that closed
// abnormally since the last one, and a describe of one followed request
// in turn; only a describe that finds its workflow gone makes it describe
// every followed request, which is what a lost server needs.
//
// Only requests whose workflow is known to have started are checked: a
// request still waiting at a door (this instance's or another's) has no
// workflow yet, and its door ends it.
type Sweeper struct {
	temporal  client.Client
	namespace string
	events    *events.Log
	// returner gives back what a gone request held in any pool.
	returner *holdings.Returner
	logger   *slog.Logger

	mu       sync.Mutex
	followed map[string]*followedRequest
	// turn numbers followed requests in the order they came; the probe
	// takes them in that order, after lastProbed, so each gets its turn.
	turn, lastProbed uint64
	// closedSince is where the next search for closed workflows starts.
	closedSince time.Time
}

// followedRequest is a request that has readers in this process.
type followedRequest struct {
	readers int
	started bool
	// order places it in the probe's round.
	order uint64
}

// New is the sweeper of the chat workflows in namespace: what a gone
// request held in its returner's gate is given back, and its stream in
// log ended.
func New(tc client.Client, namespace string, log *events.Log, returner *holdings.Returner, logger *slog.Logger) *Sweeper {
	return &Sweeper{temporal: tc, namespace: namespace, events: log, returner: returner, logger: logger, followed: map[string]*followedRequest{}}
}

// Follow registers a reader of id; the returned func unregisters it.
func (l *Sweeper) Follow(id string) func() {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.followed[id]
	if !ok {
		l.turn++
		f = &followedRequest{order: l.turn}
		l.followed[id] = f
	}
	f.readers++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if f.readers--; f.readers == 0 {
			delete(l.followed, id)
		}
	}
}

// Started notes that id's workflow exists (it wrote a stage or a token).
func (l *Sweeper) Started(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.followed[id]; ok {
		f.started = true
	}
}

// Run checks every livenessInterval until ctx ends.
func (l *Sweeper) Run(ctx context.Context) {
	t := time.NewTicker(livenessInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			l.check(ctx)
		}
	}
}

// check runs one round: closed workflows first, then the probe.
func (l *Sweeper) check(ctx context.Context) {
	ids := l.startedIDs()
	if len(ids) == 0 {
		// Nothing followed: the next search need not reach back past now.
		l.closedSince = time.Now()
		return
	}
	if err := l.endClosed(ctx, ids); err != nil && ctx.Err() == nil {
		l.logger.Warn("search for chat workflows that closed without an end", "err", err)
	}
	if l.probe(ctx) {
		l.sweep(ctx, ids)
	}
}

// startedIDs are the followed requests whose workflow has started.
func (l *Sweeper) startedIDs() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := map[string]bool{}
	for id, f := range l.followed {
		if f.started {
			ids[id] = true
		}
	}
	return ids
}

// endClosed ends the streams of followed requests whose workflow closed
// abnormally since the last search. A completed workflow wrote its end.
func (l *Sweeper) endClosed(ctx context.Context, ids map[string]bool) error {
	now := time.Now()
	since := l.closedSince
	if since.IsZero() {
		since = now.Add(-livenessInterval)
	}
	q := fmt.Sprintf("WorkflowType = '%s' AND ExecutionStatus IN ('Terminated', 'TimedOut', 'Failed', 'Canceled') AND CloseTime > '%s'",
		workflows.ChatWorkflowName, since.Add(-closedLookBack).UTC().Format(time.RFC3339Nano))
	var token []byte
	for {
		resp, err := l.temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: l.namespace, Query: q, NextPageToken: token,
		})
		if err != nil {
			return fmt.Errorf("list workflows (%s): %w", q, err)
		}
		for _, ex := range resp.GetExecutions() {
			if id := workflows.RequestIDOf(ex.GetExecution().GetWorkflowId()); ids[id] {
				l.End(ctx, id, ex.GetStatus())
			}
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	l.closedSince = now
	return nil
}

// probe describes the next followed request in turn and reports whether
// its workflow is gone, which it then ends.
func (l *Sweeper) probe(ctx context.Context) bool {
	id, ok := l.nextTurn()
	if !ok {
		return false
	}
	gone, status := l.Describe(ctx, id)
	if gone {
		l.End(ctx, id, status)
	}
	return gone
}

// nextTurn is the started request with the lowest order past the last
// one probed, wrapping around.
func (l *Sweeper) nextTurn() (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var best, first string
	var bestOrder, firstOrder uint64
	for id, f := range l.followed {
		if !f.started {
			continue
		}
		if first == "" || f.order < firstOrder {
			first, firstOrder = id, f.order
		}
		if f.order > l.lastProbed && (best == "" || f.order < bestOrder) {
			best, bestOrder = id, f.order
		}
	}
	if best == "" {
		best, bestOrder = first, firstOrder
	}
	if best != "" {
		l.lastProbed = bestOrder
	}
	return best, best != ""
}

// sweep describes every started request (after a probe found one gone:
// the server may have lost them all) and ends those that are gone.
func (l *Sweeper) sweep(ctx context.Context, ids map[string]bool) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(sweepConcurrency)
	for id := range ids {
		g.Go(func() error {
			if gone, status := l.Describe(gctx, id); gone {
				l.End(gctx, id, status)
			}
			return nil
		})
	}
	_ = g.Wait()
}

// Describe reports whether id's workflow is gone: not found, or closed
// other than by completing. An unreachable server says nothing.
func (l *Sweeper) Describe(ctx context.Context, id string) (bool, enums.WorkflowExecutionStatus) {
	desc, err := l.temporal.DescribeWorkflow(ctx, workflows.ChatWorkflowID(id), "")
	switch {
	case conn.NotFound(err):
		return true, enums.WORKFLOW_EXECUTION_STATUS_UNSPECIFIED
	case err != nil:
		return false, 0
	}
	switch desc.Status {
	case enums.WORKFLOW_EXECUTION_STATUS_RUNNING, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED,
		enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW:
		return false, desc.Status
	}
	return true, desc.Status
}

// End gives back the permit or queue place a request whose workflow is
// gone can no longer give back (waking whoever it goes to), then writes
// its error event unless its stream already ended: its readers end with
// what is there. Releases are idempotent, so two instances that both find
// it gone give back one place.
func (l *Sweeper) End(ctx context.Context, id string, status enums.WorkflowExecutionStatus) {
	h := holdings.Holdings{RequestID: id, Pools: l.returner.Gate.Pools()}
	if _, err := l.returner.GiveBack(ctx, h, holdings.Used{}); err != nil && ctx.Err() == nil {
		l.logger.Warn("give back the place of a request whose workflow is gone", "requestID", id, "err", err)
	}
	_, written, err := l.events.AppendFinal(ctx, id, events.TypeError, goneFailure(status))
	switch {
	case err != nil && ctx.Err() == nil:
		l.logger.Warn("end the stream of a request whose workflow is gone", "requestID", id, "status", status.String(), "err", err)
	case written:
		l.logger.Warn("request's workflow is gone; its stream ends with an error", "requestID", id, "status", status.String())
	}
}

// goneFailure says why a request whose workflow is gone ended.
func goneFailure(status enums.WorkflowExecutionStatus) events.Failure {
	why := "was lost by the workflow service"
	switch status {
	case enums.WORKFLOW_EXECUTION_STATUS_TERMINATED:
		why = "was terminated by an operator"
	case enums.WORKFLOW_EXECUTION_STATUS_TIMED_OUT:
		why = "ran out of time"
	case enums.WORKFLOW_EXECUTION_STATUS_CANCELED:
		why = "was cancelled"
	case enums.WORKFLOW_EXECUTION_STATUS_FAILED:
		why = "failed"
	}
	return events.Failure{
		Reason: request.ReasonInternal, RetryAfterS: 1,
		Message: "The request " + why + " before it could answer. Please retry.",
	}
}
