package workflows

import (
	"cmp"
	"errors"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// a is only used to name activity methods; Temporal resolves them by name
// on the worker, where a real *Activities is registered.
var a *activities.Chat

// ChatWorkflow runs one chat request through embed → admission → retrieval
// → rerank → LLM, and always gives back what admission granted.
func ChatWorkflow(ctx workflow.Context, in ChatInput) (ChatResult, error) {
	w := &chat{in: in, status: Status{Stage: request.StageEmbed, Tenant: in.Tenant, KB: in.KB}}
	if err := w.setup(ctx); err != nil {
		return ChatResult{}, err
	}
	w.run(ctx)
	// finalize runs on every path out of run: a workflow panic is not a
	// path out (Temporal retries the workflow task), everything else is.
	w.finalize(ctx)
	// A hand-off can race the end of the wait (a timeout, a cancel, a
	// grant seen by a re-check or by the admission activity itself):
	// finalize has released whatever the signal announced, so the signal
	// itself is spent.
	for w.admittedCh.ReceiveAsync(nil) {
	}
	return w.result, nil
}

type chat struct {
	in     ChatInput
	status Status
	logger log.Logger

	// stageCtx is cancelled by a cancel signal, a client gone for longer
	// than the grace period, or cancellation of the workflow itself.
	stageCtx     workflow.Context
	cancelStages workflow.CancelFunc
	cancelReason string
	// llmRunning is true while the LLM activity may be streaming, so that a
	// cancel also raises the stream's stop flag.
	llmRunning bool

	admittedCh workflow.ReceiveChannel
	// pool is set once admission answered; admitting is true from the first
	// admission call on, so that finalize releases even if that call's
	// answer was lost (cancelled or failed after it took a permit).
	pool      string
	seq       int64
	admitting bool
	// promptBound is the answer-cache lookup's count of the prompt's
	// bound, which admission routes by instead of counting again.
	promptBound int
	// doneWritten: the stream already wrote the done event; turnRecorded:
	// it recorded the answer in the session too.
	doneWritten  bool
	turnRecorded bool
	// used is what the request consumed, for the rate-limit refund; nil
	// when a stream ended in a way that does not tell.
	used    *activities.Used
	result  ChatResult
	failure *events.Failure
}

func (w *chat) setup(ctx workflow.Context) error {
	w.logger = log.With(workflow.GetLogger(ctx), "requestID", w.in.RequestID)
	w.stageCtx, w.cancelStages = workflow.WithCancel(ctx)
	w.admittedCh = workflow.GetSignalChannel(ctx, SignalAdmitted)
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (Status, error) {
		return w.status, nil
	}); err != nil {
		return err
	}
	workflow.Go(ctx, w.watchCancel)
	return nil
}

// watchCancel turns the cancel signal, workflow cancellation and a client
// detached beyond the grace period into cancellation of the stages.
func (w *chat) watchCancel(ctx workflow.Context) {
	cancelCh := workflow.GetSignalChannel(ctx, SignalCancel)
	detachCh := workflow.GetSignalChannel(ctx, SignalDetach)
	attachCh := workflow.GetSignalChannel(ctx, SignalAttach)
	attached := 1
	var grace workflow.Future
	var stopGrace workflow.CancelFunc
	for w.cancelReason == "" {
		if attached <= 0 && grace == nil {
			if w.in.Settings.DisconnectGrace <= 0 {
				w.requestCancel(ctx, "client_disconnected")
				return
			}
			var gctx workflow.Context
			gctx, stopGrace = workflow.WithCancel(ctx)
			grace = workflow.NewTimer(gctx, w.in.Settings.DisconnectGrace)
		}
		if attached > 0 && grace != nil {
			stopGrace()
			grace = nil
		}
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(cancelCh, func(c workflow.ReceiveChannel, _ bool) {
			var s CancelSignal
			c.Receive(ctx, &s)
			reason := s.Reason
			if reason == "" {
				reason = "cancel_signal"
			}
			w.requestCancel(ctx, reason)
		})
		sel.AddReceive(detachCh, func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(ctx, nil)
			attached--
		})
		sel.AddReceive(attachCh, func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(ctx, nil)
			attached++
		})
		sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) {
			w.requestCancel(ctx, "workflow_cancelled")
		})
		if grace != nil {
			sel.AddFuture(grace, func(f workflow.Future) {
				if f.Get(ctx, nil) == nil {
					w.requestCancel(ctx, "client_disconnected")
				}
			})
		}
		sel.Select(ctx)
	}
}

func (w *chat) requestCancel(ctx workflow.Context, reason string) {
	if w.cancelReason != "" || w.status.Stage == request.StageFinished {
		return
	}
	w.cancelReason = reason
	w.status.CancelRequested = true
	w.logger.Info("cancel requested", "reason", reason, "stage", w.status.Stage)
	w.cancelStages()
	if w.llmRunning {
		// Activity cancellation reaches a running activity only with its
		// next heartbeat; the stop flag ends the stream within one token.
		dctx, _ := workflow.NewDisconnectedContext(ctx)
		f := workflow.ExecuteLocalActivity(localCtx(dctx), a.StopStream, activities.StopStreamInput{RequestID: w.in.RequestID})
		if err := f.Get(dctx, nil); err != nil {
			w.logger.Warn("raise stop flag", "error", err)
		}
	}
}

// run executes the stages; on any early exit w.result says why.
func (w *chat) run(ctx workflow.Context) {
	w.result = ChatResult{Outcome: request.OutcomeFailed, Reason: request.ReasonInternal}
	// Nothing is consumed until the LLM is called.
	w.used = &activities.Used{}

	sctx := localCtx(w.stageCtx)
	var emb activities.EmbedOutput
	if err := workflow.ExecuteLocalActivity(sctx, a.EmbedQuery, activities.EmbedInput{
		RequestID: w.in.RequestID, Query: w.in.Query,
	}).Get(sctx, &emb); err != nil {
		w.stageFailed(request.StageEmbed, err)
		return
	}
	w.timing(request.StageEmbed, emb.Ms, emb.Cache)

	// Histories from before the answer cache have no AnswerCache setting
	// and so schedule no lookup: they replay unchanged.
	if w.in.Settings.AnswerCache && w.answeredFromCache() {
		return
	}

	if !w.admit(ctx) {
		return
	}

	w.status.Stage = request.StageRetrieval
	var ret activities.RetrieveOutput
	if err := workflow.ExecuteLocalActivity(sctx, a.Retrieve, activities.RetrieveInput{
		RequestID: w.in.RequestID, KB: w.in.KB, Query: w.in.Query, K: w.in.Settings.Candidates,
	}).Get(sctx, &ret); err != nil {
		w.stageFailed(request.StageRetrieval, err)
		return
	}
	tier := "miss"
	if ret.CacheHit {
		tier = "redis"
	}
	w.timing(request.StageRetrieval, ret.Ms, tier)
	w.result.KBVersion = ret.KBVersion

	w.status.Stage = request.StageRerank
	var rr activities.RerankOutput
	if err := workflow.ExecuteLocalActivity(sctx, a.Rerank, activities.RerankInput{
		RequestID: w.in.RequestID, KB: w.in.KB, KBVersion: ret.KBVersion, Query: w.in.Query, Hits: ret.Hits, K: w.in.Settings.TopK,
	}).Get(sctx, &rr); err != nil {
		w.stageFailed(request.StageRerank, err)
		return
	}
	w.timing(request.StageRerank, rr.Ms, "")

	w.status.Stage = request.StageLLM
	lctx := workflow.WithActivityOptions(w.stageCtx, workflow.ActivityOptions{
		StartToCloseTimeout: w.in.Settings.LLMTimeout,
		HeartbeatTimeout:    w.in.Settings.LLMHeartbeat,
		// Wait for the stream to really stop before its permit is released.
		WaitForCancellation: true,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:    200 * time.Millisecond,
			BackoffCoefficient: 2,
			MaximumInterval:    2 * time.Second,
			MaximumAttempts:    int32(w.in.Settings.LLMMaxAttempts),
			NonRetryableErrorTypes: []string{
				activities.ErrTypeStreamInterrupted, activities.ErrTypeCancelled, activities.ErrTypeBadRequest,
			},
		},
	})
	var out activities.LLMOutput
	var err error
	for readmits := 0; ; readmits++ {
		w.llmRunning = true
		w.used = nil
		err = workflow.ExecuteActivity(lctx, a.StreamLLM, activities.LLMInput{
			RequestID: w.in.RequestID, Pool: w.pool, Query: w.in.Query,
			KB: w.in.KB, KBVersion: ret.KBVersion, Context: rr.Hits, MaxTokens: w.in.MaxTokens,
			Done: w.doneSoFar(), Session: w.session(), CacheAnswer: w.in.Settings.AnswerCache,
		}).Get(lctx, &out)
		w.llmRunning = false
		var appErr *temporal.ApplicationError
		if err == nil || readmits == maxReadmits || !errors.As(err, &appErr) || appErr.Type() != activities.ErrTypePermitLost {
			break
		}
		// The permit expired before the stream started (nothing was
		// streamed): back to the queue, at the request's old place.
		if !w.admit(ctx) {
			return
		}
		w.status.Stage = request.StageLLM
	}
	if err != nil {
		w.used = streamedBefore(err)
		w.stageFailed(request.StageLLM, err)
		return
	}
	w.used = &activities.Used{Tokens: out.Usage.TotalTokens, Requests: 1}
	w.timing(request.StageLLMFirstToken, out.FirstTokenMs, "")
	w.timing(request.StageLLM, out.Ms, "")
	w.doneWritten = out.DoneWritten
	w.turnRecorded = out.TurnRecorded

	w.result.Outcome = request.OutcomeDone
	w.result.Reason = ""
	w.result.Usage = out.Usage
	w.result.FinishReason = out.FinishReason
	w.result.Sources = out.Sources
	w.result.ContextShed = out.ContextShed
}

// answeredFromCache asks the answer cache (L3) and reports whether the
// request ended there: answered (the lookup streamed the answer and the
// done event) or cancelled. A failed lookup is only a miss.
func (w *chat) answeredFromCache() bool {
	sctx := localCtx(w.stageCtx)
	var out activities.LookupAnswerOutput
	err := workflow.ExecuteLocalActivity(sctx, a.LookupAnswer, activities.LookupAnswerInput{
		RequestID: w.in.RequestID, Query: w.in.Query, KB: w.in.KB, MaxTokens: w.in.MaxTokens,
		Done: w.doneSoFar(),
	}).Get(sctx, &out)
	if w.stageCtx.Err() != nil {
		w.cancelled()
		return true
	}
	if err != nil {
		w.logger.Warn("answer cache lookup failed; answering", "error", err)
		return false
	}
	if !out.Hit {
		w.timing(request.StageAnswerCache, out.Ms, "miss")
		w.promptBound = out.PromptBound
		return false
	}
	w.timing(request.StageAnswerCache, out.Ms, "hit")
	// No permit, no LLM tokens: only the request itself is charged.
	w.used = &activities.Used{Requests: 1}
	w.doneWritten = true
	w.result = ChatResult{
		Outcome: request.OutcomeDone, Route: request.RouteCache, FinishReason: out.FinishReason,
		KBVersion: out.KBVersion, Sources: out.Sources, ContextShed: out.ContextShed,
	}
	return true
}

// session names the request's conversation for the activities; nil when
// it has none.
func (w *chat) session() *activities.SessionRef {
	if w.in.SessionID == "" {
		return nil
	}
	return &activities.SessionRef{Tenant: w.in.Tenant, ID: w.in.SessionID, HistoryTokens: w.in.Settings.HistoryTokens}
}

// turn is what the session records of the request at its end; nil when
// there is no session or the stream already recorded it.
func (w *chat) turn() *activities.TurnInput {
	ref := w.session()
	if ref == nil || w.turnRecorded {
		return nil
	}
	outcome := w.result.Outcome
	if outcome == request.OutcomeDone && w.result.FinishReason == "length" {
		outcome = request.OutcomeTruncated
	}
	return &activities.TurnInput{Session: *ref, Query: w.in.Query, Outcome: outcome, Reason: w.result.Reason}
}

// shedRetryAfter is the Retry-After of a request the healer shed.
const shedRetryAfter = 30 * time.Second

// maxReadmits bounds how often a request whose permit expired before its
// stream started queues again.
const maxReadmits = 3

// admit gets a permit, waiting in the queue if needed. It returns false
// when the request must end (w.result says why). Called again after a
// permit was lost, it asks in the same pool with the old place's token.
func (w *chat) admit(ctx workflow.Context) bool {
	w.status.Stage = request.StageAdmission
	sctx := localCtx(w.stageCtx)
	start := workflow.Now(ctx)
	var adm activities.AdmitOutput
	w.admitting = true
	// A signal still unread here is from an earlier grant (one the admit
	// activity caught itself, before a permit was lost): not this one.
	for w.admittedCh.ReceiveAsync(nil) {
	}
	if err := workflow.ExecuteLocalActivity(sctx, a.Admit, activities.AdmitInput{
		RequestID: w.in.RequestID, Query: w.in.Query, KB: w.in.KB, MaxTokens: w.in.MaxTokens,
		Pool: cmp.Or(w.pool, w.in.Pool), Seq: w.seq, PromptBound: w.promptBound,
		Tenant: w.in.Tenant, Weight: w.in.Settings.Weight, MaxPerTenant: w.in.Settings.MaxPerTenant,
		RecheckBase: w.in.Settings.RecheckInterval, RecheckMax: w.in.Settings.MaxRecheckInterval,
		FastWait: w.in.Settings.FastWait, Session: w.session(),
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
		w.reject(request.ReasonQueueFull, "The service is at capacity and its queue is full. Please retry shortly.", w.in.Settings.RecheckInterval)
		return false
	}
	if adm.TenantFull {
		w.reject(request.ReasonTenantQueueFull, "Your organisation already has as many requests waiting as its plan allows. Please retry when some have finished.", w.in.Settings.RecheckInterval)
		return false
	}
	queuedMs := adm.Ms
	maxWait := w.in.Settings.MaxWait
	if d, ok := w.in.Settings.MaxWaitByPool[adm.Pool]; ok {
		maxWait = d
	}
	deadline := start.Add(maxWait)
	for !adm.Granted {
		w.status.Position = adm.Position
		w.status.EstimatedWaitMs = adm.EstimatedWaitMs
		remaining := deadline.Sub(workflow.Now(ctx))
		if remaining <= 0 {
			w.timing(request.StageAdmission, workflow.Now(ctx).Sub(start).Milliseconds(), "")
			retry := time.Duration(adm.EstimatedWaitMs) * time.Millisecond
			w.reject(request.ReasonQueueTimeout, "The service is busy and your request waited too long in the queue. Please retry in a moment.", retry)
			return false
		}
		wait := w.in.Settings.RecheckInterval
		if adm.NextRecheckMs > 0 {
			// Far back in the queue: the activity kept the place live
			// this long.
			wait = time.Duration(adm.NextRecheckMs) * time.Millisecond
		}
		wait = min(wait, remaining)
		tctx, stopTimer := workflow.WithCancel(w.stageCtx)
		timer := workflow.NewTimer(tctx, wait)
		signalled, fired := false, false
		sel := workflow.NewSelector(w.stageCtx)
		sel.AddReceive(w.admittedCh, func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(w.stageCtx, nil)
			signalled = true
		})
		sel.AddFuture(timer, func(f workflow.Future) { fired = f.Get(tctx, nil) == nil })
		sel.AddReceive(w.stageCtx.Done(), func(workflow.ReceiveChannel, bool) {})
		sel.Select(w.stageCtx)
		stopTimer()
		if w.stageCtx.Err() != nil {
			w.cancelled()
			return false
		}
		if signalled {
			// The releaser moved our entry to the permit set before
			// signalling, so the permit is already ours.
			adm.Granted = true
			break
		}
		if !fired {
			continue
		}
		var re activities.AdmitOutput
		if err := workflow.ExecuteLocalActivity(sctx, a.Admit, activities.AdmitInput{
			RequestID: w.in.RequestID, Pool: w.pool, Seq: adm.Seq, Recheck: true,
			Tenant: w.in.Tenant, Weight: w.in.Settings.Weight, MaxPerTenant: w.in.Settings.MaxPerTenant,
			RecheckBase: w.in.Settings.RecheckInterval, RecheckMax: w.in.Settings.MaxRecheckInterval,
		}).Get(sctx, &re); err != nil {
			if w.stageCtx.Err() != nil {
				w.cancelled()
				return false
			}
			if isShed(err) {
				// Shed before the healer's cancel signal arrived.
				w.stageFailed(request.StageAdmission, err)
				return false
			}
			// A failed re-check is not fatal: the next one, the signal or
			// the deadline decides.
			w.logger.Warn("admission re-check failed", "error", err)
			continue
		}
		queuedMs += re.Ms
		adm.Granted, adm.Position, adm.EstimatedWaitMs, adm.NextRecheckMs = re.Granted, re.Position, re.EstimatedWaitMs, re.NextRecheckMs
	}
	w.status.Position = 0
	w.status.EstimatedWaitMs = 0
	elapsed := workflow.Now(ctx).Sub(start).Milliseconds()
	w.timing(request.StageAdmission, max(elapsed, queuedMs), "")
	return true
}

// streamedBefore reads what a failed stream consumed from its error's
// details; nil when it does not say (e.g. cancelled by Temporal or timed
// out), and then nothing is refunded.
func streamedBefore(err error) *activities.Used {
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) {
		return nil
	}
	if !appErr.HasDetails() {
		// Failures before the first token carry no details and consumed
		// nothing: the backend refused or never answered.
		if appErr.Type() == activities.ErrTypeBackend || appErr.Type() == activities.ErrTypeBadRequest {
			return &activities.Used{}
		}
		return nil
	}
	var u events.Usage
	if appErr.Details(&u) != nil {
		return nil
	}
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
	var appErr *temporal.ApplicationError
	reason, msg := request.ReasonInternal, "The request failed. Please retry."
	if errors.As(err, &appErr) {
		switch appErr.Type() {
		case activities.ErrTypeStreamInterrupted:
			reason, msg = request.ReasonStreamInterrupted, "The answer stream was interrupted. Please retry."
		case activities.ErrTypeBackend:
			reason, msg = request.ReasonBackendError, "The language model backend failed. Please retry."
		case activities.ErrTypeBadRequest:
			reason, msg = request.ReasonBadRequest, "The request could not be processed: "+appErr.Message()
		}
	}
	w.logger.Error("stage failed", "stage", stage, "error", err)
	w.result.Outcome, w.result.Reason = request.OutcomeFailed, reason
	w.failure = &events.Failure{Reason: reason, Message: msg}
}

func (w *chat) cancelled() {
	if w.cancelReason == request.ReasonShed {
		// The healer shed the queue of this request's tier: a rejection
		// the client should retry, not a cancel it asked for. Not soon:
		// shedding means the pool is overloaded.
		w.reject(request.ReasonShed, "The service is overloaded and dropped waiting requests of your plan. Please retry in a little while.", shedRetryAfter)
		return
	}
	w.result.Outcome, w.result.Reason = request.OutcomeCancelled, request.ReasonCancelled
	w.failure = &events.Failure{Reason: request.ReasonCancelled, Message: "The request was cancelled (" + w.cancelReason + ")."}
}

func (w *chat) reject(reason, msg string, retryAfter time.Duration) {
	w.result.Outcome, w.result.Reason = request.OutcomeRejected, reason
	secs := int((retryAfter + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	w.failure = &events.Failure{Reason: reason, Message: msg, RetryAfterS: secs}
}

func (w *chat) timing(stage string, ms int64, cache string) {
	w.status.Timings = append(w.status.Timings, events.StageTiming{Stage: stage, Ms: ms, Cache: cache})
}

// doneSoFar is the done event as far as the workflow knows it; the stream
// completes it.
func (w *chat) doneSoFar() *events.Done {
	return &events.Done{
		RequestID: w.in.RequestID, Route: w.result.Route, KBVersion: w.result.KBVersion,
		Timings: append([]events.StageTiming(nil), w.status.Timings...),
	}
}

func (w *chat) upsert(ctx workflow.Context, u ...temporal.SearchAttributeUpdate) {
	if !w.in.Settings.SearchAttributes {
		return
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, u...); err != nil {
		// Only searchability is lost, never the request.
		w.logger.Warn("upsert search attribute", "error", err)
	}
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
	w.result.Timings = w.status.Timings
	in.Report = &activities.Report{Route: w.result.Route, Outcome: w.result.Outcome, Reason: w.result.Reason, Timings: w.result.Timings}
	switch w.result.Outcome {
	case request.OutcomeDone:
		if w.doneWritten {
			break
		}
		in.EventType = events.TypeDone
		in.Done = &events.Done{
			RequestID: w.in.RequestID, Route: w.result.Route, FinishReason: w.result.FinishReason,
			Usage: w.result.Usage, Timings: w.result.Timings, KBVersion: w.result.KBVersion,
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
		// The permit's lease and the waiter's liveness TTL bound the damage.
		w.logger.Error("finalize failed", "error", err)
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
	w.logger.Info("request finished", "outcome", w.result.Outcome, "reason", w.result.Reason, "route", w.result.Route)
}

func localCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout:    5 * time.Second,
		ScheduleToCloseTimeout: 20 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:    50 * time.Millisecond,
			BackoffCoefficient: 2,
			MaximumInterval:    time.Second,
			MaximumAttempts:    5,
		},
	})
}
