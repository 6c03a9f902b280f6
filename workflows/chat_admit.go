package workflows

import (
	"cmp"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/request"
)

// admit gets a permit, waiting in the queue if needed. It returns false
// when the request must end (w.result says why). Called again after a
// permit was lost, it asks in the same pool with the old place's token.
func (w *chat) admit(ctx workflow.Context) bool {
	w.status.Stage = request.StageAdmission
	sctx := localCtx(w.stageCtx)
	start := workflow.Now(ctx)
	waitFor := w.maxWait(cmp.Or(w.pool, w.in.Pool))
	var adm activities.AdmitOutput
	w.admitting = true
	// A signal still unread here is from an earlier grant (one the admit
	// activity caught itself, before a permit was lost): not this one.
	for w.admittedCh.ReceiveAsync(nil) {
	}
	if err := workflow.ExecuteLocalActivity(sctx, a.Admit, activities.AdmitInput{
		RequestID: w.in.RequestID, Query: w.in.Query, KB: w.in.KBRef().Key(), MaxTokens: w.in.MaxTokens,
		Pool: cmp.Or(w.pool, w.in.Pool), Seq: w.seq, PromptBound: w.promptBound,
		Tenant: w.in.Tenant, Weight: w.in.Settings.Weight, MaxPerTenant: w.in.Settings.MaxPerTenant,
		MaxConcurrent: w.in.Settings.MaxConcurrent, Tokens: w.in.AdmissionTokens, Place: w.takePlace(),
		WaitFor: waitFor, FastWait: w.in.Settings.FastWait, Session: w.session(), ServiceTier: w.in.ServiceTier,
		Deadline: w.in.Deadline, SLO: w.in.Settings.TTFTSLO,
	}).Get(sctx, &adm); err != nil {
		w.stageFailed(request.StageAdmission, err)
		return false
	}
	w.pool = adm.Pool
	if adm.Seq != 0 {
		w.seq = adm.Seq
	}
	w.status.Pool = adm.Pool
	w.result.Route = adm.Pool
	if adm.Full {
		w.reject(request.ReasonQueueFull, w.in.Settings.RecheckInterval)
		return false
	}
	if adm.TenantFull {
		w.reject(request.ReasonTenantQueueFull, w.in.Settings.RecheckInterval)
		return false
	}
	queuedMs := adm.Ms
	if !adm.Granted && w.unreachable(ctx, start, adm) {
		return false
	}
	if !adm.Granted {
		recheckMs, ok := w.waitUntilDeadline(ctx, start, adm)
		if !ok {
			return false
		}
		queuedMs += recheckMs
	}
	w.status.Position = 0
	w.status.EstimatedWaitMs = 0
	elapsed := workflow.Now(ctx).Sub(start).Milliseconds()
	w.timing(request.StageAdmission, max(elapsed, queuedMs), "")
	return true
}

// waitUntilDeadline waits in the queue, from start, until the permit is
// handed over (the admitted signal), the request is cancelled, or its max
// wait runs out: one timer, and no re-checks, whatever the wait. At the
// deadline it looks at the queue once, in case the grant's signal was
// lost. It returns the time that look took, and false when the request
// must end (w.result says why).
func (w *chat) waitUntilDeadline(ctx workflow.Context, start time.Time, adm activities.AdmitOutput) (recheckMs int64, ok bool) {
	w.status.Position = adm.Position
	w.status.EstimatedWaitMs = adm.EstimatedWaitMs
	deadline := start.Add(w.maxWait(adm.Pool))
	if remaining := deadline.Sub(workflow.Now(ctx)); remaining > 0 {
		tctx, stopTimer := workflow.WithCancel(w.stageCtx)
		defer stopTimer()
		timer := workflow.NewTimer(tctx, remaining)
		for {
			got := w.awaitGrant(tctx, timer)
			if w.stageCtx.Err() != nil {
				w.cancelled()
				return recheckMs, false
			}
			if got.signalled {
				// The releaser moved our entry to the permit set before
				// signalling, so the permit is already ours.
				return recheckMs, true
			}
			if got.fired {
				break
			}
			// Redis lost the queue: the look puts this waiter back at its
			// old place (or finds it granted), and the wait goes on on the
			// same timer.
			re, err := w.recheck(adm.Seq, deadline.Sub(workflow.Now(ctx)))
			recheckMs += re.Ms
			if err == nil && re.Granted {
				return recheckMs, true
			}
		}
	}
	re, err := w.recheck(adm.Seq, 0)
	re.Ms += recheckMs
	switch {
	case w.stageCtx.Err() != nil:
		w.cancelled()
		return re.Ms, false
	case err != nil && isShed(err):
		w.stageFailed(request.StageAdmission, err)
		return re.Ms, false
	case err != nil:
		// Finalize gives back whatever the request holds.
		w.logger.Warn("admission check at the deadline failed", "error", err)
	case re.Granted:
		return re.Ms, true
	default:
		adm.EstimatedWaitMs = re.EstimatedWaitMs
	}
	w.timedOut(ctx, start, adm)
	return re.Ms, false
}

// timedOut rejects a request whose max wait ran out in the queue, telling
// it to come back after its estimated wait.
func (w *chat) timedOut(ctx workflow.Context, start time.Time, adm activities.AdmitOutput) {
	w.timing(request.StageAdmission, workflow.Now(ctx).Sub(start).Milliseconds(), "")
	retry := time.Duration(adm.EstimatedWaitMs) * time.Millisecond
	if w.in.Settings.RefuseLate {
		w.rejectWith(request.Unreachable(w.in.ServiceTier, w.in.Settings.TTFTSLO, 0, retry))
		return
	}
	w.reject(request.ReasonQueueTimeout, retry)
}

// unreachable rejects at once a queued request of a class that refuses
// late requests when the wait estimated ahead of it is longer than what
// is left of its max wait (its deadline): its place would only delay
// those behind it. Finalize gives the place back. Not when a stream may
// be paused for it (adm.MayPause): a pause, not the turnover that
// estimate reckons, gets it its permit.
func (w *chat) unreachable(ctx workflow.Context, start time.Time, adm activities.AdmitOutput) bool {
	if !w.in.Settings.RefuseLate || adm.MayPause {
		return false
	}
	ahead := time.Duration(adm.EstimatedWaitMs) * time.Millisecond
	if ahead <= start.Add(w.maxWait(adm.Pool)).Sub(workflow.Now(ctx)) {
		return false
	}
	w.timing(request.StageAdmission, workflow.Now(ctx).Sub(start).Milliseconds(), "")
	w.rejectWith(request.Unreachable(w.in.ServiceTier, w.in.Settings.TTFTSLO, ahead, ahead))
	return true
}

// maxWait is how long the request may wait for a permit in pool: its
// tier's max wait, or the pool's when the tier set none.
func (w *chat) maxWait(pool string) time.Duration {
	if d, ok := w.in.Settings.MaxWaitByPool[pool]; ok {
		return d
	}
	return w.in.Settings.MaxWait
}

// woken says what ended a wait for the grant.
type woken struct {
	// signalled: the admitted signal; fired: the timer; recheck: a
	// SignalRecheck. None: the stages were cancelled.
	signalled, fired, recheck bool
}

// awaitGrant waits for the admitted signal, timer (made in tctx), a
// recheck request or the stages' cancellation, whichever comes first.
func (w *chat) awaitGrant(tctx workflow.Context, timer workflow.Future) woken {
	var got woken
	sel := workflow.NewSelector(w.stageCtx)
	sel.AddReceive(w.admittedCh, func(c workflow.ReceiveChannel, _ bool) {
		c.Receive(w.stageCtx, nil)
		got.signalled = true
	})
	sel.AddFuture(timer, func(f workflow.Future) { got.fired = f.Get(tctx, nil) == nil })
	sel.AddReceive(w.recheckCh, func(c workflow.ReceiveChannel, _ bool) {
		c.Receive(w.stageCtx, nil)
		got.recheck = true
	})
	sel.AddReceive(w.stageCtx.Done(), func(workflow.ReceiveChannel, bool) {})
	sel.Select(w.stageCtx)
	return got
}

// takePlace is the door's place for the first admission, none after.
func (w *chat) takePlace() request.Place {
	if w.placeTaken {
		return request.Place{}
	}
	w.placeTaken = true
	return w.in.AdmissionPlace
}

// recheck asks whether a queued request's turn has come (the fallback to
// the admitted signal), keeping its place live for waitFor (0: the gate's
// default, for a last look at the deadline).
func (w *chat) recheck(seq int64, waitFor time.Duration) (activities.AdmitOutput, error) {
	sctx := localCtx(w.stageCtx)
	var re activities.AdmitOutput
	err := workflow.ExecuteLocalActivity(sctx, a.Admit, activities.AdmitInput{
		RequestID: w.in.RequestID, Pool: w.pool, Seq: seq, Recheck: true, WaitFor: waitFor,
		Tenant: w.in.Tenant, Weight: w.in.Settings.Weight, MaxPerTenant: w.in.Settings.MaxPerTenant,
		MaxConcurrent: w.in.Settings.MaxConcurrent, Tokens: w.in.AdmissionTokens, ServiceTier: w.in.ServiceTier,
		Deadline: w.in.Deadline, SLO: w.in.Settings.TTFTSLO,
	}).Get(sctx, &re)
	return re, err
}
