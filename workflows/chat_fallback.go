package workflows

import (
	"cmp"
	"errors"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// versionPoolFallbacks: a stream that ends with activities.ErrTypeFallback
// moves on to the pool's next fallback. Workflows from before it never
// asked the activity to fall back, so their failed streams end as they
// did.
const versionPoolFallbacks = "pool-fallbacks"

// fallBack moves a request whose stream failed before its first token,
// in a way a fallback may answer, on to the next fallback of its pool:
// another model (same pool, same permit) or another pool (this pool's
// permit given back, the other's asked for through admission, which
// keeps its fairness and accounting). next: stream again; ended: the
// request ended on the way (w.result says why).
func (w *chat) fallBack(ctx workflow.Context, err error) (next, ended bool) {
	if workflow.GetVersion(ctx, versionPoolFallbacks, workflow.DefaultVersion, 1) < 1 {
		return false, false
	}
	fallen, ok := fallenOf(err)
	if !ok || !w.fallbackLeft() {
		return false, false
	}
	to := w.in.Settings.Fallbacks[w.fallbacksOf][w.taken]
	w.taken++
	// A model fallback is on the endpoints of the pool whose list it is.
	toPool := cmp.Or(to.Pool, w.fallbacksOf)
	step := events.Fallback{From: fallen.Model, FromPool: w.pool, To: to.Model, ToPool: toPool, Reason: fallen.Reason}
	w.logger.Warn("llm pool could not answer; falling back", "from", step.From, "from_pool", step.FromPool,
		"to", step.To, "to_pool", step.ToPool, "reason", step.Reason)
	w.fallback = &step
	w.status.Fallbacks = append(w.status.Fallbacks, step)
	w.llmModel = to.Model
	// Nothing was streamed: nothing is billed for the pool that failed.
	w.used = &activities.Used{}
	if toPool == w.pool {
		return true, false
	}
	if !w.leavePool() {
		return false, true
	}
	w.pool, w.seq = toPool, 0
	if !w.admit(ctx) {
		return false, true
	}
	return true, false
}

// fallbackLeft reports whether the request has a fallback it has not
// taken; the first call fixes whose list it follows: its pool's.
func (w *chat) fallbackLeft() bool {
	if w.fallbacksOf == "" {
		w.fallbacksOf = w.pool
	}
	return w.taken < len(w.in.Settings.Fallbacks[w.fallbacksOf])
}

// leavePool gives back the permit of the pool the request leaves (the
// release that settles what admission charged: nothing was streamed). A
// failure ends the request; finalize then gives the permit back.
func (w *chat) leavePool() bool {
	sctx := localCtx(w.stageCtx)
	if err := workflow.ExecuteLocalActivity(sctx, a.Finalize, activities.FinalizeInput{
		RequestID: w.in.RequestID, Pool: w.pool, Used: &activities.Used{},
	}).Get(sctx, nil); err != nil {
		w.stageFailed(request.StageLLM, err)
		return false
	}
	return true
}

// fallenOf is why a stream's pool could not answer and which model it
// asked, when the activity said a fallback may answer
// (activities.ErrTypeFallback).
func fallenOf(err error) (activities.Fallen, bool) {
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) || appErr.Type() != activities.ErrTypeFallback {
		return activities.Fallen{}, false
	}
	var f activities.Fallen
	if appErr.Details(&f) != nil || f.Reason == "" {
		f.Reason = request.ReasonBackendError
	}
	return f, true
}
