package activities

import (
	"context"
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Admit asks for a permit in the request's pool (chosen here on the first
// call from an upper bound of the prompt), or re-checks a queued request.
// Waiters that this call granted a permit are woken.
func (a *Chat) Admit(ctx context.Context, in AdmitInput) (AdmitOutput, error) {
	start := time.Now()
	out := AdmitOutput{Pool: in.Pool}
	if out.Pool == "" {
		out = a.route(ctx, in)
	}
	res, err := a.enqueue(ctx, in, out.Pool)
	if err != nil {
		return out, err
	}
	out.Seq = res.Seq
	out.Granted = res.Status == admission.Granted
	out.Full = res.Status == admission.Full
	out.TenantFull = res.Status == admission.TenantFull
	out.Position = res.Position
	out.EstimatedWaitMs = res.EstimatedWait().Milliseconds()
	if err := a.announceQueued(ctx, in, res, out); err != nil {
		return out, err
	}
	if res.Status == admission.Queued {
		out.MayPause = a.preemptFor(ctx, in, out.Pool)
	}
	if a.Waker != nil && in.FastWait > 0 && !in.Recheck && res.Status == admission.Queued && res.Position <= res.Limit {
		granted, err := a.waitFast(ctx, in, out.Pool)
		if err != nil {
			return out, err
		}
		if granted {
			out.Granted, out.Position, out.EstimatedWaitMs = true, 0, 0
		}
	}
	out.Ms = time.Since(start).Milliseconds()
	return out, nil
}

// route picks a first call's pool from an upper bound of its prompt,
// the session's earlier turns included.
func (a *Chat) route(ctx context.Context, in AdmitInput) AdmitOutput {
	var out AdmitOutput
	_, out.HistoryTokens = a.history(ctx, in.RequestID, in.Session)
	bound := in.PromptBound
	if bound == 0 {
		bound = a.promptBound(in.Query)
	}
	out.EstimatedPromptTokens = bound + out.HistoryTokens
	out.Pool = request.Route(bound, out.HistoryTokens, a.Options.ShortThreshold)
	return out
}

// placeIn is the door's place for the request if it queues in pool's
// group, the group whose clock tagged it; a place of another group (the
// request was routed elsewhere) is given back, and none returned.
func (a *Chat) placeIn(ctx context.Context, in AdmitInput, pool string) request.Place {
	p := in.Place
	if p.Tag == 0 || a.Gate.SameGroup(p.Pool, pool) {
		return p
	}
	if err := a.Gate.Unreserve(ctx, p); err != nil {
		a.logger(in.RequestID).Warn("give back the door's place in another pool; it lapses", "err", err)
	}
	return request.Place{}
}

// enqueue asks pool's gate for a permit or a place in its queue, writing
// the admission stage's event meanwhile on a first call, and wakes the
// waiters the call granted. A request the gate no longer knows to be
// waiting fails for good.
func (a *Chat) enqueue(ctx context.Context, in AdmitInput, pool string) (admission.Result, error) {
	written := func() error { return nil }
	if !in.Recheck {
		written = a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageAdmission, Pool: pool})
	}
	// A tier without a weight counts as weight 1.
	weight := max(in.Weight, 1)
	var alive time.Duration
	if in.WaitFor > 0 {
		alive = in.WaitFor + deadlineMargin
	}
	res, err := a.Gate.Enqueue(ctx, pool, admission.Request{
		ID: in.RequestID, Tenant: in.Tenant, Weight: weight, Cost: admission.TokenCost(in.Tokens),
		MaxPerTenant: in.MaxPerTenant, MaxConcurrent: in.MaxConcurrent, Seq: in.Seq, AliveFor: alive,
		Place: a.placeIn(ctx, in, pool), Deadline: in.Deadline, SLO: in.SLO,
		Class: request.ServedClass(in.ServiceTier),
	})
	werr := written()
	if err != nil {
		return res, err
	}
	if len(res.Woken) > 0 {
		if err := admission.Wake(ctx, a.Gate, a.Notifier, res.Woken); err != nil {
			a.logger(in.RequestID).Warn("wake granted waiters", "err", err)
		}
	}
	if werr != nil {
		// Retried whole; Enqueue answers a second call with the same state.
		return res, werr
	}
	switch res.Status {
	case admission.Shed:
		// The healer shed it; its cancel signal may still be on the way.
		return res, temporal.NewNonRetryableApplicationError("request was shed from the queue", ErrTypeShed, nil)
	case admission.Gone:
		// Only a call racing the request's own finalize gets here.
		return res, temporal.NewNonRetryableApplicationError("request already released its admission", ErrTypeCancelled, nil)
	}
	return res, nil
}

// deadlineMargin is how long a place outlives its waiter's deadline: for
// the workflow's timer to fire late (timers are coarse), its task to run
// and its last look at the queue to arrive.
const deadlineMargin = 30 * time.Second

// announceQueued tells the client its place in the queue; re-checks stay
// quiet.
func (a *Chat) announceQueued(ctx context.Context, in AdmitInput, res admission.Result, out AdmitOutput) error {
	if in.Recheck || res.Status != admission.Queued {
		return nil
	}
	_, err := a.Events.Append(ctx, in.RequestID, events.TypeQueue, events.Queue{
		Position: res.Position, EstimatedWaitMs: out.EstimatedWaitMs, Pool: out.Pool,
	})
	return err
}

// waitFast waits up to in.FastWait for a queued request's grant to be
// announced, for a request whose turn is near: the releaser's hand-off
// already made the permit its own, and the announcement saves the signal's
// round trip through Temporal. A grant made before the request was marked
// as waiting fast was signalled instead; the workflow then finds the
// signal when it parks.
func (a *Chat) waitFast(ctx context.Context, in AdmitInput, pool string) (granted bool, err error) {
	fast, err := a.Waker.Expect(ctx, in.RequestID, in.FastWait+5*time.Second)
	if err != nil {
		return false, err
	}
	t := time.NewTimer(in.FastWait)
	defer t.Stop()
	select {
	case <-fast.C:
	case <-t.C:
	case <-ctx.Done():
	}
	// End even when cancelled: the mark must not outlive the wait, or a
	// releaser would announce to nobody instead of signalling. (A
	// cancelled request's finalize releases whatever it holds.)
	granted, err = fast.End(context.WithoutCancel(ctx))
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	return granted, err
}

// preemptFor asks, for a request that had to queue, that a stream of a
// less urgent class be paused for it (stream_pause.go), and has the
// Asker ask again until it is granted. The gate asks only when no permit
// is free for it; a failure leaves the request waiting as without
// preemption. It reports whether a stream may be paused for the request
// at all: preemption is on, a pool it may take a paused stream's permit
// from continues answers (only their streams offer to pause), and a
// class less urgent than the request's exists.
func (a *Chat) preemptFor(ctx context.Context, in AdmitInput, pool string) bool {
	rank, _ := request.ClassRank(request.ServedClass(in.ServiceTier))
	if !a.Options.Preemption.Enabled || !a.Options.Preemption.From[pool] || !request.PausesOthers(rank) {
		return false
	}
	var victim string
	var err error
	if a.Asker != nil {
		victim, err = a.Asker.Want(ctx, pool, in.RequestID, rank, in.WaitFor)
	} else {
		victim, err = a.Gate.Preempt(ctx, pool, in.RequestID, rank, a.Options.Preemption.PauseRules)
	}
	if err != nil && !errors.Is(err, admission.ErrNotQueued) {
		a.logger(in.RequestID).Warn("ask for a stream to pause", "err", err)
		return true
	}
	if victim != "" {
		// Asked again, the gate names the same stream: debug, not info.
		a.logger(in.RequestID).Debug("asked a less urgent stream to pause", "pool", pool, "paused", victim)
	}
	return true
}
