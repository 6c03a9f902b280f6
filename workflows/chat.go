package workflows

import (
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// a is only used to name activity methods; Temporal resolves them by name
// on the worker, where a real *activities.Chat is registered.
var a *activities.Chat

// ChatWorkflow runs one chat request through embed → admission → retrieval
// → rerank → LLM, and always gives back what admission granted.
func ChatWorkflow(ctx workflow.Context, in ChatInput) (ChatResult, error) {
	w := &chat{in: in, status: Status{Stage: request.StageEmbed, Tenant: in.Tenant, KB: in.KB, ServiceTier: in.ServiceTier}, promptBound: in.PromptBound}
	if in.Fallback != nil {
		w.fallback = in.Fallback
		w.status.Fallbacks = []events.Fallback{*in.Fallback}
	}
	if err := w.setup(ctx); err != nil {
		return ChatResult{}, err
	}
	w.run(ctx)
	// finalize runs on every path out of run: a workflow panic is not a
	// path out (Temporal retries the workflow task), everything else is.
	w.finalize(ctx)
	// After the terminal event and the permit's release: the client and
	// the next waiter never wait for the store or the ledger.
	w.storeResponse(ctx)
	w.recordUsage(ctx)
	// A hand-off can race the end of the wait (a timeout, a cancel, a
	// grant seen by a re-check or by the admission activity itself):
	// finalize has released whatever the signal announced, so the signal
	// itself is spent.
	for w.admittedCh.ReceiveAsync(nil) {
	}
	// A recheck asked of a request that was not waiting is spent too.
	for w.recheckCh.ReceiveAsync(nil) {
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
	// recheckCh asks a waiter to look at the queue (SignalRecheck).
	recheckCh workflow.ReceiveChannel
	// pool is set once admission answered; admitting is true from the first
	// admission call on, so that finalize releases even if that call's
	// answer was lost (cancelled or failed after it took a permit).
	pool string
	seq  int64
	// placeTaken: the first admission has run, taking the door's place
	// (ChatInput.AdmissionPlace); a later one queues anew.
	placeTaken bool
	admitting  bool
	// promptBound is the prompt's bound before retrieval, the door's
	// (ChatInput.PromptBound) or else the answer-cache lookup's, which
	// admission routes by instead of counting again.
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
	// billed is what the model call consumed, for the usage ledger: the
	// answer's usage, or what a stream that failed or was cancelled
	// midway reported; cachedTokens what an answer-cache hit served; model
	// the model that answered.
	billed       events.Usage
	cachedTokens int
	model        string
	// fallbacksOf is the pool whose fallbacks the request follows (the
	// first it streamed in), taken how many of them it took so far;
	// llmModel the model the stream asks for ("": the pool's own);
	// fallback the last step.
	fallbacksOf string
	taken       int
	llmModel    string
	fallback    *events.Fallback
}

func (w *chat) setup(ctx workflow.Context) error {
	w.logger = log.With(workflow.GetLogger(ctx), "requestID", w.in.RequestID)
	w.stageCtx, w.cancelStages = workflow.WithCancel(ctx)
	w.admittedCh = workflow.GetSignalChannel(ctx, SignalAdmitted)
	w.recheckCh = workflow.GetSignalChannel(ctx, SignalRecheck)
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (Status, error) {
		return w.status, nil
	}); err != nil {
		return err
	}
	workflow.Go(ctx, w.watchCancel)
	return nil
}

// run executes the stages; on any early exit w.result says why.
func (w *chat) run(ctx workflow.Context) {
	w.result = ChatResult{Outcome: request.OutcomeFailed, Reason: request.ReasonInternal}
	// Nothing is consumed until the LLM is called.
	w.used = &activities.Used{}
	if w.in.Gateway {
		// The client's prompt goes to the model as it is: nothing to
		// embed, retrieve or look up.
		if w.admit(ctx) {
			w.stream(ctx, 0, nil)
		}
		return
	}
	if !w.embed() {
		return
	}
	if w.in.Settings.AnswerCache && w.answeredFromCache() {
		return
	}
	if !w.admit(ctx) {
		return
	}
	ret, ok := w.retrieve()
	if !ok {
		return
	}
	rr, ok := w.rerank(ret)
	if !ok {
		return
	}
	w.stream(ctx, ret.KBVersion, rr.Hits)
}

// embed looks the query's embedding up (the L1 tier), computing it on a
// miss.
func (w *chat) embed() bool {
	sctx := localCtx(w.stageCtx)
	var emb activities.EmbedOutput
	if err := workflow.ExecuteLocalActivity(sctx, a.EmbedQuery, activities.EmbedInput{
		RequestID: w.in.RequestID, Query: w.in.Query,
	}).Get(sctx, &emb); err != nil {
		w.stageFailed(request.StageEmbed, err)
		return false
	}
	w.timing(request.StageEmbed, emb.Ms, emb.Cache)
	return true
}

// retrieve fetches the candidate chunks (through the L2 tier).
func (w *chat) retrieve() (activities.RetrieveOutput, bool) {
	w.status.Stage = request.StageRetrieval
	sctx := localCtx(w.stageCtx)
	var ret activities.RetrieveOutput
	if err := workflow.ExecuteLocalActivity(sctx, a.Retrieve, activities.RetrieveInput{
		RequestID: w.in.RequestID, KB: w.in.KBRef().Key(), Query: w.in.Query, K: w.in.Settings.Candidates,
	}).Get(sctx, &ret); err != nil {
		w.stageFailed(request.StageRetrieval, err)
		return ret, false
	}
	tier := "miss"
	if ret.CacheHit {
		tier = "redis"
	}
	w.timing(request.StageRetrieval, ret.Ms, tier)
	w.result.KBVersion = ret.KBVersion
	return ret, true
}

// rerank orders the candidates and keeps the best top_k.
func (w *chat) rerank(ret activities.RetrieveOutput) (activities.RerankOutput, bool) {
	w.status.Stage = request.StageRerank
	sctx := localCtx(w.stageCtx)
	var rr activities.RerankOutput
	if err := workflow.ExecuteLocalActivity(sctx, a.Rerank, activities.RerankInput{
		RequestID: w.in.RequestID, KB: w.in.KBRef().Key(), KBVersion: ret.KBVersion, Query: w.in.Query, Hits: ret.Hits, K: w.in.Settings.TopK,
	}).Get(sctx, &rr); err != nil {
		w.stageFailed(request.StageRerank, err)
		return rr, false
	}
	w.timing(request.StageRerank, rr.Ms, "")
	return rr, true
}

// answeredFromCache asks the answer cache (L3) and reports whether the
// request ended there: answered (the lookup streamed the answer and the
// done event) or cancelled. A failed lookup is only a miss.
func (w *chat) answeredFromCache() bool {
	sctx := localCtx(w.stageCtx)
	var out activities.LookupAnswerOutput
	err := workflow.ExecuteLocalActivity(sctx, a.LookupAnswer, activities.LookupAnswerInput{
		RequestID: w.in.RequestID, Query: w.in.Query, KB: w.in.KBRef().Key(), MaxTokens: w.in.MaxTokens,
		Pool: w.in.Pool, PromptBound: w.promptBound, Done: w.doneFacts(),
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
	w.cachedTokens = out.CachedTokens
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
	return &activities.SessionRef{Tenant: w.in.Tenant, User: w.in.User, ID: w.in.SessionID, HistoryTokens: w.in.Settings.HistoryTokens}
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

func (w *chat) timing(stage string, ms int64, cache string) {
	w.status.Timings = append(w.status.Timings, events.StageTiming{Stage: stage, Ms: ms, Cache: cache})
}

// doneFacts is what the workflow knows of the request's done event; the
// activity that answers builds the event from it.
func (w *chat) doneFacts() *activities.DoneFacts {
	return &activities.DoneFacts{
		RequestID: w.in.RequestID, Route: w.result.Route, KBVersion: w.result.KBVersion,
		Timings: append([]events.StageTiming(nil), w.status.Timings...), Fallback: w.fallback,
		ServiceTier: w.in.ServiceTier,
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
