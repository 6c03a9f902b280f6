package workflows

import (
	"errors"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// shedRetryAfter is the Retry-After of a request the healer shed.
const shedRetryAfter = 30 * time.Second

// dependencyRetryAfter is the retry advice of a request that failed
// because a dependency was out of reach: about what a Redis restart or a
// cluster failover's promotion takes once noticed. A retry that comes too
// early is refused cheaply at the door (503) while Redis is still away.
const dependencyRetryAfter = 2 * time.Second

// streamedBefore reads what a failed stream consumed from its error's
// details; nil when it does not say (e.g. cancelled by Temporal or timed
// out), and then nothing is refunded.
func streamedBefore(err error) *activities.Used {
	var canceled *temporal.CanceledError
	if errors.As(err, &canceled) {
		// A stream Temporal cancelled reports what it had consumed.
		var u events.Usage
		if !canceled.HasDetails() || canceled.Details(&u) != nil {
			return nil
		}
		return usedOf(u)
	}
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) {
		return nil
	}
	if appErr.Type() == activities.ErrTypeBackendUnavailable || appErr.Type() == activities.ErrTypeFallback {
		// Refused before anything was sent; its details say when to retry.
		return &activities.Used{}
	}
	if !appErr.HasDetails() {
		// Failures before the first token carry no details and consumed
		// nothing: the backend refused or never answered, or the permit
		// was lost before the call.
		switch appErr.Type() {
		case activities.ErrTypeBackend, activities.ErrTypeBadRequest, activities.ErrTypePermitLost:
			return &activities.Used{}
		}
		return nil
	}
	var u events.Usage
	if appErr.Details(&u) != nil {
		return nil
	}
	return usedOf(u)
}

// usedOf is what a stream that consumed u is billed: its tokens, and the
// request if it consumed any.
func usedOf(u events.Usage) *activities.Used {
	requests := 0
	if u.TotalTokens > 0 {
		requests = 1
	}
	return &activities.Used{Tokens: u.TotalTokens, Requests: requests}
}

// isShed reports an admission error saying the healer shed the request.
func isShed(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == activities.ErrTypeShed
}

// stageFailed classifies a stage error into the request's outcome.
func (w *chat) stageFailed(stage string, err error) {
	if isShed(err) {
		// Admission found the request shed by the healer: the same end as
		// the healer's cancel signal, which may not have arrived yet.
		w.cancelReason = request.ReasonShed
	}
	if w.cancelReason == request.ReasonShed || w.stageCtx.Err() != nil || temporal.IsCanceledError(err) {
		w.cancelled()
		return
	}
	if w.dependencyUnavailable(stage, err) {
		return
	}
	var appErr *temporal.ApplicationError
	reason, msg := request.ReasonInternal, "The request failed. Please retry."
	if errors.As(err, &appErr) {
		switch appErr.Type() {
		case activities.ErrTypeStreamInterrupted:
			reason, msg = request.ReasonStreamInterrupted, "The answer stream was interrupted. Please retry."
		case activities.ErrTypeBackend:
			reason, msg = request.ReasonBackendError, "The language model backend failed. Please retry."
		case activities.ErrTypeBackendUnavailable:
			w.backendUnavailable(appErr)
			return
		case activities.ErrTypeFallback:
			// Only a request with a fallback left is told to fall back:
			// one that ends here lost it (a failed move).
			reason, msg = request.ReasonBackendError, "The language model backend could not answer. Please retry."
		case activities.ErrTypeBadRequest:
			reason, msg = request.ReasonBadRequest, "The request could not be processed: "+appErr.Message()
		case activities.ErrTypeKBTooLarge:
			reason, msg = request.ReasonKBTooLarge, "The request could not be served: "+appErr.Message()
		}
	}
	w.logger.Error("stage failed", "stage", stage, "error", err)
	w.result.Outcome, w.result.Reason = request.OutcomeFailed, reason
	w.failure = &events.Failure{Reason: reason, Message: msg}
}

// dependencyUnavailable fails the request with reason unavailable and
// when to retry when its stage failed because a dependency was out of
// reach — Redis failing over or restarting, an embedding service
// unreachable: the activity says so (ErrTypeDependencyUnavailable), or a
// stage before the model timed out on every attempt, which only a stalled
// dependency makes it do. The request may well succeed when retried; it
// is not Sluice's fault to report as internal_error.
func (w *chat) dependencyUnavailable(stage string, err error) bool {
	var appErr *temporal.ApplicationError
	marked := errors.As(err, &appErr) && appErr.Type() == activities.ErrTypeDependencyUnavailable
	if !marked && (stage == request.StageLLM || !temporal.IsTimeoutError(err)) {
		return false
	}
	w.logger.Warn("stage failed: a dependency was unavailable", "stage", stage, "error", err)
	w.fail(request.Refused(request.ReasonUnavailable, dependencyRetryAfter))
	return true
}

// backendUnavailable fails a request refused because every backend of its
// pool has its circuit open: nothing is wrong with the request, and the
// client is told when to try again.
func (w *chat) backendUnavailable(appErr *temporal.ApplicationError) {
	var d activities.BackendUnavailable
	if err := appErr.Details(&d); err != nil {
		w.logger.Warn("read the retry-after of an unavailable backend", "error", err)
	}
	f := request.Refused(request.ReasonBackendUnavailable, d.RetryAfter)
	w.logger.Warn("llm backend unavailable", "retry_after_s", f.RetryAfterS)
	w.fail(f)
}

// fail ends the request as failed with f.
func (w *chat) fail(f request.Failure) {
	w.result.Outcome, w.result.Reason = request.OutcomeFailed, f.Reason
	w.failure = &f
}

func (w *chat) cancelled() {
	if w.cancelReason == request.ReasonShed {
		// The healer shed the queue of this request's tier: a rejection
		// the client should retry, not a cancel it asked for. Not soon:
		// shedding means the pool is overloaded.
		w.reject(request.ReasonShed, shedRetryAfter)
		return
	}
	w.result.Outcome, w.result.Reason = request.OutcomeCancelled, request.ReasonCancelled
	w.failure = &events.Failure{Reason: request.ReasonCancelled, Message: "The request was cancelled (" + w.cancelReason + ")."}
}

// reject ends the request as rejected for reason, to be retried after
// retryAfter.
func (w *chat) reject(reason string, retryAfter time.Duration) {
	w.rejectWith(request.Refused(reason, retryAfter))
}

// rejectWith ends the request as rejected with failure f.
func (w *chat) rejectWith(f request.Failure) {
	w.result.Outcome, w.result.Reason = request.OutcomeRejected, f.Reason
	w.failure = &f
}

// finalize runs on every exit path, in a disconnected context so that it
// also runs after cancellation: it gives back the permit or queue place
// exactly once and writes the terminal event.
func (w *chat) finalize(ctx workflow.Context) {
	if w.cancelReason != "" && w.result.Outcome != request.OutcomeCancelled && w.result.Outcome != request.OutcomeDone {
		// Cancelled while a stage was failing: report the cancel.
		w.cancelled()
	}
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	in := activities.FinalizeInput{
		RequestID: w.in.RequestID, Pool: w.pool, AllPools: w.admitting && w.pool == "",
		StopStream: w.cancelReason != "", Used: w.used, Reservation: w.in.RateReservation,
	}
	in.Turn = w.turn()
	if w.in.BudgetReservation != "" {
		// Settled with the ledger's figures (usageEntry), whatever the
		// outcome: a cancelled or broken stream pays for what it used, at
		// the price of the model that answered (a fallback's, if it took
		// one), as a month rebuilt from the ledger prices it.
		in.Budget = &activities.BudgetSettle{Reservation: w.in.BudgetReservation,
			PromptTokens: w.billed.PromptTokens, CompletionTokens: w.billed.CompletionTokens,
			Pool: w.pool, Model: w.answeredBy()}
	}
	w.result.Timings = w.status.Timings
	in.Report = &activities.Report{Route: w.result.Route, Outcome: w.result.Outcome, Reason: w.result.Reason, Timings: w.result.Timings,
		Tier: w.in.Tier, Usage: w.result.Usage, Tenant: w.in.Tenant, ServiceTier: w.in.ServiceTier}
	switch w.result.Outcome {
	case request.OutcomeDone:
		if w.doneWritten {
			break
		}
		// The answering activity did not write it (it was not handed
		// the facts): Finalize builds it from them.
		in.EventType = events.TypeDone
		in.Done = w.doneFacts()
		in.Answer = &activities.Answer{
			FinishReason: w.result.FinishReason, Usage: w.result.Usage,
			Sources: w.result.Sources, ContextShed: w.result.ContextShed,
		}
	case request.OutcomeRejected:
		in.EventType = events.TypeRejected
		in.Failure = w.failure
	default:
		in.EventType = events.TypeError
		in.Failure = w.failure
		if in.Failure == nil {
			in.Failure = &events.Failure{Reason: request.ReasonInternal, Message: "The request failed. Please retry."}
		}
	}
	fctx := workflow.WithLocalActivityOptions(dctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 5 * time.Second,
		// Giving back a permit must not be lost to a Redis blip; it is
		// idempotent, so retry for a good while.
		ScheduleToCloseTimeout: 2 * time.Minute,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaximumInterval: 5 * time.Second},
	})
	if err := workflow.ExecuteLocalActivity(fctx, a.Finalize, in).Get(fctx, nil); err != nil {
		w.logger.Error("finalize failed for two minutes; retrying it until Redis takes it", "error", err)
		if err = w.finalizeDurably(dctx, in); err != nil {
			// The permit's lease and the waiter's liveness TTL bound the
			// damage; the refund is lost.
			w.logger.Error("finalize failed", "error", err)
		}
	}
	w.status.Stage = request.StageFinished
	w.status.Outcome = w.result.Outcome
	w.status.Reason = w.result.Reason
	w.status.Position = 0
	w.status.EstimatedWaitMs = 0
	// Route and outcome go in one upsert at the end: one visibility write
	// per request instead of two; a running request's route is in its
	// status query.
	updates := []temporal.SearchAttributeUpdate{SearchOutcome.ValueSet(w.result.Outcome)}
	if w.result.Route != "" {
		updates = append(updates, SearchRoute.ValueSet(w.result.Route))
	}
	w.upsert(ctx, updates...)
	// The request's log line is Finalize's (request.Finished): it has the
	// tenant, each stage's time, the tokens and the trace.
}

// finalizeDurably retries Finalize as a regular activity, whose retries the
// server schedules (no workflow task and no timer per attempt), for as long
// as a day: a permit, a queue place and a refund
// are given back when Redis returns, not dropped after an outage of a few
// minutes. Finalize is idempotent. The report is left out: an attempt that
// failed later may already have made it, and a lost sample costs the
// metrics less than a doubled one.
func (w *chat) finalizeDurably(ctx workflow.Context, in activities.FinalizeInput) error {
	in.Report = nil
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout:    30 * time.Second,
		ScheduleToCloseTimeout: finalizePatience,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute,
		},
	})
	return workflow.ExecuteActivity(actx, a.Finalize, in).Get(actx, nil)
}

// finalizePatience is how long a Finalize that Redis refuses is retried.
const finalizePatience = 24 * time.Hour
