package goodput

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/tests/load/internal/load"
	"github.com/sluice-dev/sluice/workflows"
)

// What a request costs Temporal, read from its workflow's history: the
// events the server stored, the workflow tasks it dispatched, and the
// actions Temporal Cloud would bill for it.

// histCounts are one history's counts (or, summed, several histories').
type histCounts struct {
	events, workflowTasks, timers, signals, activities int
	// actions are Temporal Cloud's billable actions (see actionsOf).
	actions int
	// admitted: the history has the admitted signal, so the request
	// waited in the queue for a permit handed over by a releaser.
	admitted bool
}

func (c *histCounts) add(o histCounts) {
	c.events += o.events
	c.workflowTasks += o.workflowTasks
	c.timers += o.timers
	c.signals += o.signals
	c.activities += o.activities
	c.actions += o.actions
}

// Marker names the Go SDK records (internal_command_state_machine.go).
const (
	markerLocalActivity     = "LocalActivity"
	markerSideEffect        = "SideEffect"
	markerMutableSideEffect = "MutableSideEffect"
)

// countHistory counts one workflow's history.
func countHistory(evs []*historypb.HistoryEvent) histCounts {
	c := histCounts{events: len(evs), actions: actionsOf(evs)}
	for _, ev := range evs {
		switch ev.GetEventType() {
		case enums.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
			c.workflowTasks++
		case enums.EVENT_TYPE_TIMER_STARTED:
			c.timers++
		case enums.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
			c.signals++
			if ev.GetWorkflowExecutionSignaledEventAttributes().GetSignalName() == workflows.SignalAdmitted {
				c.admitted = true
			}
		case enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			c.activities++
		}
	}
	return c
}

// actionsOf counts the billable actions of a history the way Temporal
// Cloud does (https://docs.temporal.io/cloud/actions, "Temporal Cloud
// Actions"): a workflow start, each activity attempt, each timer, each
// signal, each search attribute upsert (several attributes in one upsert
// are one), each side effect, each accepted update or options update;
// a child workflow is two (its start and its execution). Local activities
// are one action per workflow task that recorded any: Cloud counts all of
// a task's RecordMarker commands as one. A signal is counted where it was
// received, so a signal between two sampled workflows is counted once.
// Queries and activity heartbeats are billed too but leave no event, so
// they are not here (a Sluice request sends neither on its way).
func actionsOf(evs []*historypb.HistoryEvent) int {
	n := 0
	// The workflow task whose commands the events that follow record.
	var task int64
	laTasks := map[int64]bool{}
	for _, ev := range evs {
		switch ev.GetEventType() {
		case enums.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
			task = ev.GetEventId()
		case enums.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
			enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
			enums.EVENT_TYPE_TIMER_STARTED,
			enums.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
			enums.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
			enums.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
			enums.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED:
			n++
		case enums.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
			n += 2
		case enums.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			// Retries leave no event of their own: the started event
			// records the attempt that finished.
			n += max(0, int(ev.GetActivityTaskStartedEventAttributes().GetAttempt())-1)
		case enums.EVENT_TYPE_MARKER_RECORDED:
			switch ev.GetMarkerRecordedEventAttributes().GetMarkerName() {
			case markerLocalActivity:
				laTasks[task] = true
			case markerSideEffect, markerMutableSideEffect:
				n++
			}
		}
	}
	return n + len(laTasks)
}

// histAgg sums the counts of n histories.
type histAgg struct {
	n   int
	sum histCounts
}

func (a *histAgg) add(c histCounts) {
	a.n++
	a.sum.add(c)
}

// per returns a field of the sum averaged over the histories (0 if none).
func (a histAgg) per(field func(histCounts) int) float64 {
	if a.n == 0 {
		return 0
	}
	return float64(field(a.sum)) / float64(a.n)
}

// histSummary is a step's sample of histories, split into requests
// admitted at once and requests that waited in the queue.
type histSummary struct {
	once, queued histAgg
	// failed counts the histories that could not be read.
	failed int
}

// all is both halves together.
func (s histSummary) all() histAgg {
	a := s.once
	a.n += s.queued.n
	a.sum.add(s.queued.sum)
	return a
}

// sampleHistories reads the histories of up to limit of the step's
// requests that started a workflow, spread evenly over them, and counts
// them. A request is queued if its client saw a queue event, or its
// history shows a wait (the admitted signal, or a re-check timer).
func sampleHistories(ctx context.Context, c client.Client, reqs []attempt, limit int) histSummary {
	var picked []attempt
	for _, r := range reqs {
		if r.ID != "" {
			picked = append(picked, r)
		}
	}
	picked = spread(picked, limit)
	var (
		mu  sync.Mutex
		sum histSummary
		wg  sync.WaitGroup
	)
	jobs := load.Feed(ctx, len(picked))
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				evs, err := readClosedHistory(ctx, c, picked[i].ID)
				mu.Lock()
				if err != nil {
					sum.failed++
				} else if hc := countHistory(evs); picked[i].Queued || hc.admitted || hc.timers > 0 {
					sum.queued.add(hc)
				} else {
					sum.once.add(hc)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return sum
}

// spread returns up to n of xs, evenly spaced.
func spread[T any](xs []T, n int) []T {
	if n <= 0 || len(xs) <= n {
		return xs
	}
	out := make([]T, n)
	for i := range out {
		out[i] = xs[i*len(xs)/n]
	}
	return out
}

// closeWait bounds the wait for a sampled workflow to close: a client
// has its answer (the done event) a little before its workflow completes,
// and one that gave up leaves a workflow that may still wait in the queue.
const closeWait = 30 * time.Second

// readClosedHistory reads a workflow's history once it has closed, or
// as far as it got within closeWait.
func readClosedHistory(ctx context.Context, c client.Client, id string) ([]*historypb.HistoryEvent, error) {
	wctx, cancel := context.WithTimeout(ctx, closeWait)
	// Its result does not matter: a failed workflow is closed too.
	_ = c.GetWorkflow(wctx, id, "").Get(wctx, nil)
	cancel()
	return readHistory(ctx, c, id)
}

// readHistory reads a workflow's whole history (its current run).
func readHistory(ctx context.Context, c client.Client, id string) ([]*historypb.HistoryEvent, error) {
	it := c.GetWorkflowHistory(ctx, id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var evs []*historypb.HistoryEvent
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return nil, fmt.Errorf("history of %s: %w", id, err)
		}
		evs = append(evs, ev)
	}
	return evs, nil
}
