// Package activities holds the side effects of a chat request: cache
// lookups, admission, retrieval, rerank, the streamed LLM call and the final
// release. Fast steps run as local activities; the LLM stream is a regular
// activity so that it survives a worker crash (it heartbeats).
package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/answercache"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/rerank"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/session"
)

// Aliases of pool names (pkg/request) kept until every caller imports
// them directly. TODO(structure): remove.
const (
	PoolShort = request.PoolShort
	PoolLong  = request.PoolLong
)

// EmbeddingCache is the L1 tier: query → embedding.
type EmbeddingCache interface {
	Get(ctx context.Context, query string) (vec []float32, tier string, err error)
}

// Retriever finds candidate chunks, through the L2 cache.
type Retriever interface {
	Retrieve(ctx context.Context, q retrieval.Query) (res retrieval.Result, cacheHit bool, err error)
}

// ChunkStore resolves chunk ids of a kb version to their text.
type ChunkStore interface {
	Lookup(ctx context.Context, kb string, version int64, ids []string) ([]retrieval.Chunk, error)
}

// Pool is one LLM pool's client.
type Pool struct {
	Streamer        llm.Streamer
	Model           string
	MaxPromptTokens int
}

// Chat holds every dependency of the chat activities. Register one
// value with the worker; workflows name its methods through a nil pointer.
type Chat struct {
	Redis    redis.UniversalClient
	Events   *events.Log
	Gate     *admission.Gate
	Notifier admission.Notifier
	// Waker, when set, lets a request whose turn is near wait for its
	// grant in Admit (AdmitInput.FastWait).
	Waker      *admission.Waker
	Embeddings EmbeddingCache
	Retriever  Retriever
	Chunks     ChunkStore
	Reranker   rerank.Reranker
	Pools      map[string]Pool
	Prompts    *prompt.Builder
	// Limiter refunds the unused part of a request's rate-limit
	// reservation; nil when limits are off.
	Limiter *limiter.Limiter
	// Sessions keeps conversations; nil: session ids are ignored.
	Sessions *session.Store
	// Answers is the L3 tier and KBVersions tells it a kb's current
	// version; nil: no request asks for it.
	Answers    *answercache.Cache
	KBVersions KBVersions
	// Metrics and Latency record finished requests (Prometheus, and the
	// window shared across instances that the healer reads); nil: not.
	Metrics *metrics.Metrics
	Latency *latency.Window
	Logger  *slog.Logger
	Options Options
}

// Options are the activity settings taken from config.
type Options struct {
	KeyPrefix string
	// ShortThreshold routes prompts of at most this many tokens to the
	// short pool.
	ShortThreshold int
	// TopK and ChunkTokens bound the context when estimating the prompt
	// before retrieval.
	TopK        int
	ChunkTokens int
	// StopFlagTTL is how long a stop flag outlives its request.
	StopFlagTTL time.Duration
	// TruncationNotice ends an answer cut at its max tokens ("": none).
	TruncationNotice string
}

// KBVersions reads a knowledge base's current version.
type KBVersions interface {
	Version(ctx context.Context, kb string) (int64, error)
}

func (a *Chat) logger(requestID string) *slog.Logger {
	return a.Logger.With("requestID", requestID)
}

func (a *Chat) stopKey(requestID string) string {
	return a.Options.KeyPrefix + "stop:" + requestID
}

// EmbedQuery looks the query's embedding up in the L1 cache, computing and
// storing it on a miss.
func (a *Chat) EmbedQuery(ctx context.Context, in EmbedInput) (EmbedOutput, error) {
	start := time.Now()
	written := a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageEmbed})
	vec, tier, err := a.Embeddings.Get(ctx, in.Query)
	if werr := written(); werr != nil {
		return EmbedOutput{}, werr
	}
	if err != nil {
		return EmbedOutput{}, fmt.Errorf("embed query of %s: %w", in.RequestID, err)
	}
	return EmbedOutput{Cache: tier, Dims: len(vec), Ms: time.Since(start).Milliseconds()}, nil
}

// beginStage writes a stage's event while the stage works, saving a Redis
// round trip per stage; the returned func waits for the write, so that
// events stay in stage order.
func (a *Chat) beginStage(ctx context.Context, requestID string, st events.Stage) func() error {
	errc := make(chan error, 1)
	go func() {
		_, err := a.Events.Append(ctx, requestID, events.TypeStage, st)
		errc <- err
	}()
	return func() error { return <-errc }
}

// promptBound is the prompt's upper bound known before retrieval: the
// query's tokens and TopK full chunks.
func (a *Chat) promptBound(query string) int {
	return a.Prompts.BoundBeforeRetrieval(query, a.Options.TopK, a.Options.ChunkTokens)
}

// Admit asks for a permit in the request's pool (chosen here on the first
// call from an upper bound of the prompt), or re-checks a queued request.
// Waiters that this call granted a permit are woken.
func (a *Chat) Admit(ctx context.Context, in AdmitInput) (AdmitOutput, error) {
	start := time.Now()
	out := AdmitOutput{Pool: in.Pool}
	if out.Pool == "" {
		_, out.HistoryTokens = a.history(ctx, in.RequestID, in.Session)
		bound := in.PromptBound
		if bound == 0 {
			bound = a.promptBound(in.Query)
		}
		out.EstimatedPromptTokens = bound + out.HistoryTokens
		out.Pool = request.Route(bound, out.HistoryTokens, a.Options.ShortThreshold)
	}
	written := func() error { return nil }
	if !in.Recheck {
		written = a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageAdmission, Pool: out.Pool})
	}
	// Histories from before weights existed replay with none: weight 1.
	weight := max(in.Weight, 1)
	res, err := a.Gate.Enqueue(ctx, out.Pool, admission.Request{
		ID: in.RequestID, Tenant: in.Tenant, Weight: weight, MaxPerTenant: in.MaxPerTenant, Seq: in.Seq,
	})
	werr := written()
	if err != nil {
		return out, err
	}
	if len(res.Woken) > 0 {
		if err := admission.Wake(ctx, a.Gate, a.Notifier, out.Pool, res.Woken); err != nil {
			a.logger(in.RequestID).Warn("wake granted waiters", "err", err)
		}
	}
	if werr != nil {
		// Retried whole; Enqueue answers a second call with the same state.
		return out, werr
	}
	if res.Status == admission.Shed {
		// The healer shed it; its cancel signal may still be on the way.
		return out, temporal.NewNonRetryableApplicationError("request was shed from the queue", ErrTypeShed, nil)
	}
	if res.Status == admission.Gone {
		// Only a call racing the request's own finalize gets here.
		return out, temporal.NewNonRetryableApplicationError("request already released its admission", ErrTypeCancelled, nil)
	}
	out.Seq = res.Seq
	out.Granted = res.Status == admission.Granted
	out.Full = res.Status == admission.Full
	out.TenantFull = res.Status == admission.TenantFull
	out.Position = res.Position
	out.EstimatedWaitMs = res.EstimatedWait().Milliseconds()
	if res.Status == admission.Queued && in.RecheckMax > in.RecheckBase {
		next := admission.RecheckAfter(res, in.RecheckBase, in.RecheckMax)
		if next > in.RecheckBase {
			// Enqueue kept the place live for the base cadence only.
			if err := a.Gate.KeepAlive(ctx, out.Pool, in.RequestID, admission.AliveFor(next)); err != nil {
				return out, err
			}
			out.NextRecheckMs = next.Milliseconds()
		}
	}
	if !in.Recheck && res.Status == admission.Queued {
		if _, err := a.Events.Append(ctx, in.RequestID, events.TypeQueue, events.Queue{
			Position: res.Position, EstimatedWaitMs: out.EstimatedWaitMs, Pool: out.Pool,
		}); err != nil {
			return out, err
		}
	}
	if a.Waker != nil && in.FastWait > 0 && !in.Recheck && res.Status == admission.Queued && res.Position <= res.Limit {
		granted, err := a.waitFast(ctx, in)
		if err != nil {
			return out, err
		}
		if granted {
			out.Granted, out.Position, out.EstimatedWaitMs, out.NextRecheckMs = true, 0, 0, 0
		}
	}
	out.Ms = time.Since(start).Milliseconds()
	return out, nil
}

// waitFast waits up to in.FastWait for a queued request's grant to be
// announced, for a request whose turn is near: the releaser's hand-off
// already made the permit its own, and the announcement saves the signal's
// round trip through Temporal. A grant made before the request was marked
// as waiting fast was signalled instead; the workflow then finds the
// signal when it parks.
func (a *Chat) waitFast(ctx context.Context, in AdmitInput) (granted bool, err error) {
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

// Retrieve fetches candidate chunks through the L2 cache.
func (a *Chat) Retrieve(ctx context.Context, in RetrieveInput) (RetrieveOutput, error) {
	start := time.Now()
	written := a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageRetrieval})
	res, hit, err := a.retrieve(ctx, in)
	if werr := written(); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		if errors.Is(err, retrieval.ErrUnknownKB) {
			return RetrieveOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeBadRequest, err)
		}
		return RetrieveOutput{}, fmt.Errorf("retrieve for %s: %w", in.RequestID, err)
	}
	return RetrieveOutput{KBVersion: res.KBVersion, Hits: refs(res.Chunks), CacheHit: hit, Ms: time.Since(start).Milliseconds()}, nil
}

func (a *Chat) retrieve(ctx context.Context, in RetrieveInput) (retrieval.Result, bool, error) {
	vec, _, err := a.Embeddings.Get(ctx, in.Query)
	if err != nil {
		return retrieval.Result{}, false, fmt.Errorf("embed query for retrieval: %w", err)
	}
	return a.Retriever.Retrieve(ctx, retrieval.Query{KB: in.KB, Text: in.Query, Vector: vec, K: in.K})
}

// lookup resolves refs to chunks carrying the refs' scores.
func (a *Chat) lookup(ctx context.Context, kb string, version int64, hits []ChunkRef) ([]retrieval.Chunk, error) {
	ids := make([]string, len(hits))
	for i, h := range hits {
		ids[i] = h.ID
	}
	chunks, err := a.Chunks.Lookup(ctx, kb, version, ids)
	if err != nil {
		// An unknown kb, or another version loaded here than the one the
		// refs came from: the request cannot be answered from the context
		// it retrieved, and retrying changes nothing. The error is returned
		// as is, because Temporal classifies only the outermost error.
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeBadRequest, err)
	}
	for i := range chunks {
		chunks[i].Score = hits[i].Score
	}
	return chunks, nil
}

// Rerank orders the candidates and keeps the best K.
func (a *Chat) Rerank(ctx context.Context, in RerankInput) (RerankOutput, error) {
	start := time.Now()
	written := a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageRerank})
	candidates, err := a.lookup(ctx, in.KB, in.KBVersion, in.Hits)
	if err != nil {
		_ = written()
		return RerankOutput{}, err
	}
	chunks, err := a.Reranker.Rerank(ctx, in.Query, candidates, in.K)
	if werr := written(); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return RerankOutput{}, fmt.Errorf("rerank for %s: %w", in.RequestID, err)
	}
	return RerankOutput{Hits: refs(chunks), Ms: time.Since(start).Milliseconds()}, nil
}

var errStopped = errors.New("stream stopped by request")

// StreamLLM streams the answer from the request's pool into its event
// stream, renewing the permit's lease and heartbeating as it goes. A
// failure before the first token is retryable; after it, it is not, because
// a model cannot resume mid-answer and the client already has a prefix.
func (a *Chat) StreamLLM(ctx context.Context, in LLMInput) (LLMOutput, error) {
	start := time.Now()
	log := a.logger(in.RequestID)
	if activity.HasHeartbeatDetails(ctx) {
		var p streamProgress
		if err := activity.GetHeartbeatDetails(ctx, &p); err == nil && p.Tokens > 0 {
			return a.afterLostAttempt(ctx, in, p)
		}
	}
	pool, ok := a.Pools[in.Pool]
	if !ok {
		return LLMOutput{}, temporal.NewNonRetryableApplicationError("unknown pool "+in.Pool, ErrTypeBadRequest, nil)
	}
	chunks, err := a.lookup(ctx, in.KB, in.KBVersion, in.Context)
	if err != nil {
		return LLMOutput{}, err
	}
	history, historyTokens := a.history(ctx, in.RequestID, in.Session)
	msgs := a.Prompts.Conversation(history, chunks, in.Query)
	promptTokens := 0
	// The cheap bound keeps exact tokenization off the time to first
	// token; only a prompt near the pool's limit is counted exactly, and
	// its lowest-ranked context shed until it fits, then its oldest turns.
	if a.Prompts.Bound(chunks, in.Query)+historyTokens > pool.MaxPromptTokens {
		promptTokens = a.Prompts.Count(msgs)
		for promptTokens > pool.MaxPromptTokens && len(chunks)+len(history) > 0 {
			if len(chunks) > 0 {
				chunks = chunks[:len(chunks)-1]
			} else {
				history = history[1:]
			}
			msgs = a.Prompts.Conversation(history, chunks, in.Query)
			promptTokens = a.Prompts.Count(msgs)
		}
	}
	// The permit was handed over when the request's turn came. A waiter
	// that took longer than a lease to wake (an overloaded worker or
	// server) finds it reclaimed and given to someone else; calling the
	// LLM then would exceed the pool's concurrency, so it queues again.
	if held, err := a.Gate.Renew(ctx, in.Pool, in.RequestID); err != nil {
		return LLMOutput{}, err
	} else if !held {
		log.Warn("permit lease ran out before the stream started; queueing again", "pool", in.Pool)
		return LLMOutput{}, temporal.NewNonRetryableApplicationError("permit lease ran out before the stream started", ErrTypePermitLost, nil)
	}
	stageWritten := a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageLLM, Pool: in.Pool})
	defer func() { _ = stageWritten() }()

	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	stopKey := a.stopKey(in.RequestID)
	var n atomic.Int64
	go a.keepAlive(sctx, stop, log, in, stopKey, &n)

	var firstToken time.Duration
	// The answer's text is kept only when the session or the L3 tier needs it.
	var answer []string
	keep := in.Session != nil || in.CacheAnswer
	res, err := pool.Streamer.Stream(sctx, llm.Request{Model: pool.Model, Messages: msgs, MaxTokens: in.MaxTokens}, func(text string) error {
		i := int(n.Load())
		if i == 0 {
			firstToken = time.Since(start)
			if err := stageWritten(); err != nil {
				return err
			}
			stageWritten = func() error { return nil }
		}
		stopped, err := a.writeToken(sctx, in.RequestID, i, text, stopKey)
		if err != nil {
			return err
		}
		if keep {
			answer = append(answer, text)
		}
		n.Add(1)
		activity.RecordHeartbeat(ctx, streamProgress{Tokens: i + 1})
		if stopped {
			return errStopped
		}
		return nil
	})
	if err != nil && errors.Is(context.Cause(sctx), errStopped) {
		err = errStopped
	}
	tokens := int(n.Load())
	// What a failed stream consumed goes with its error, for the refund.
	consumed := func() events.Usage {
		if tokens == 0 {
			return events.Usage{}
		}
		if promptTokens == 0 {
			promptTokens = a.Prompts.Count(msgs)
		}
		return events.Usage{PromptTokens: promptTokens, CompletionTokens: tokens, TotalTokens: promptTokens + tokens}
	}
	switch {
	case errors.Is(err, errStopped):
		return LLMOutput{}, temporal.NewNonRetryableApplicationError("stream stopped: request cancelled", ErrTypeCancelled, nil, consumed())
	case ctx.Err() != nil:
		// Temporal cancelled the activity (or it timed out).
		return LLMOutput{}, ctx.Err()
	case err != nil && tokens > 0:
		log.Warn("llm stream broke mid-answer", "tokens", tokens, "err", err)
		return LLMOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeStreamInterrupted, err, consumed())
	case err != nil && llm.IsRetryable(err):
		return LLMOutput{}, temporal.NewApplicationErrorWithCause(err.Error(), ErrTypeBackend, err)
	case err != nil:
		var lerr *llm.Error
		if errors.As(err, &lerr) {
			return LLMOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeBadRequest, err)
		}
		return LLMOutput{}, fmt.Errorf("stream llm for %s: %w", in.RequestID, err)
	}
	var usage events.Usage
	if res.UsageReported {
		usage = events.Usage{
			PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens, Reported: true,
		}
	} else {
		if promptTokens == 0 {
			promptTokens = a.Prompts.Count(msgs)
		}
		usage = events.Usage{PromptTokens: promptTokens, CompletionTokens: tokens}
	}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	if res.FinishReason == "length" && a.Options.TruncationNotice != "" {
		// The model stopped at max tokens, maybe mid-word: say so.
		if _, err := a.writeToken(ctx, in.RequestID, tokens, a.Options.TruncationNotice, stopKey); err != nil {
			return LLMOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeStreamInterrupted, err)
		}
		if keep {
			answer = append(answer, a.Options.TruncationNotice)
		}
	}
	out := LLMOutput{
		Usage: usage, FinishReason: res.FinishReason,
		Sources: sources(chunks), ContextShed: len(in.Context) - len(chunks),
		FirstTokenMs: firstToken.Milliseconds(), Ms: time.Since(start).Milliseconds(),
	}
	if in.Session != nil {
		out.TurnRecorded = a.recordAnswer(ctx, in, res.FinishReason, answer)
	}
	// The client gets its done event now, not after this activity's
	// completion has gone through the server to the workflow; the workflow
	// then only gives back the permit.
	if in.Done != nil {
		done := completeDone(*in.Done, out)
		if _, err := a.Events.Append(ctx, in.RequestID, events.TypeDone, done); err != nil {
			// Tokens were streamed: a retry would fail as interrupted.
			return LLMOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeStreamInterrupted, err)
		}
		out.DoneWritten = true
	}
	if in.CacheAnswer && res.FinishReason == "stop" {
		a.cacheAnswer(ctx, in, out, answer)
	}
	return out, nil
}

// completeDone fills the done event the workflow started with what the
// stream measured.
func completeDone(d events.Done, out LLMOutput) events.Done {
	d.Timings = append(append([]events.StageTiming(nil), d.Timings...),
		events.StageTiming{Stage: request.StageLLMFirstToken, Ms: out.FirstTokenMs},
		events.StageTiming{Stage: request.StageLLM, Ms: out.Ms})
	d.FinishReason = out.FinishReason
	d.Usage = out.Usage
	d.Sources = out.Sources
	d.ContextShed = out.ContextShed
	return d
}

// afterLostAttempt handles a retry of a stream whose previous attempt
// streamed tokens and was then lost (its worker died, or its completion
// never reached the server). If that attempt already wrote the done event,
// the answer is complete and this attempt reports it; otherwise the client
// has a prefix that no model can continue, and the request fails.
func (a *Chat) afterLostAttempt(ctx context.Context, in LLMInput, p streamProgress) (LLMOutput, error) {
	last, ok, err := a.Events.Last(ctx, in.RequestID)
	if err != nil {
		return LLMOutput{}, err
	}
	var done events.Done
	if ok && last.Type == events.TypeDone && json.Unmarshal(last.Data, &done) == nil {
		out := LLMOutput{
			Usage: done.Usage, FinishReason: done.FinishReason, Sources: done.Sources,
			ContextShed: done.ContextShed, DoneWritten: true,
		}
		for _, t := range done.Timings {
			switch t.Stage {
			case request.StageLLMFirstToken:
				out.FirstTokenMs = t.Ms
			case request.StageLLM:
				out.Ms = t.Ms
			}
		}
		return out, nil
	}
	return LLMOutput{}, temporal.NewNonRetryableApplicationError(
		fmt.Sprintf("previous attempt streamed %d tokens before it was lost", p.Tokens), ErrTypeStreamInterrupted, nil)
}

func sources(chunks []retrieval.Chunk) []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range chunks {
		if !seen[c.DocID] {
			seen[c.DocID] = true
			out = append(out, c.DocID)
		}
	}
	return out
}

// writeToken appends one token event and reads the stop flag in the same
// round trip.
func (a *Chat) writeToken(ctx context.Context, requestID string, index int, text, stopKey string) (bool, error) {
	args, err := a.Events.XAddArgs(requestID, events.TypeToken, events.Token{Text: text, Index: index})
	if err != nil {
		return false, err
	}
	pipe := a.Redis.Pipeline()
	pipe.XAdd(ctx, args)
	stop := pipe.Exists(ctx, stopKey)
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("write token %d of %s: %w", index, requestID, err)
	}
	return stop.Val() == 1, nil
}

// keepAlive runs beside the stream: it heartbeats (so a slow first token
// is not mistaken for a lost worker, and so Temporal can deliver a
// cancellation), checks the stop flag between tokens too, and renews the
// permit's lease at a third of its length. Its first round runs at once,
// in parallel with the request to the backend rather than before it: the
// permit may have waited through retrieval, rerank and the task queue, and
// the request may have been cancelled meanwhile.
func (a *Chat) keepAlive(ctx context.Context, stop context.CancelCauseFunc, log *slog.Logger, in LLMInput, stopKey string, n *atomic.Int64) {
	renewEvery := a.Gate.Lease() / 3
	tick := min(time.Second, renewEvery)
	t := time.NewTicker(tick)
	defer t.Stop()
	// StreamLLM renewed the lease just before starting this loop.
	lastRenew := time.Now()
	warned := false
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			activity.RecordHeartbeat(ctx, streamProgress{Tokens: int(n.Load())})
		}
		if stopped, err := a.Redis.Exists(ctx, stopKey).Result(); err == nil && stopped == 1 {
			stop(errStopped)
			return
		}
		if time.Since(lastRenew) < renewEvery {
			continue
		}
		lastRenew = time.Now()
		held, err := a.Gate.Renew(ctx, in.Pool, in.RequestID)
		if err != nil && ctx.Err() == nil {
			log.Warn("renew permit lease", "err", err)
		}
		if err == nil && !held && !warned {
			// The lease ran out (e.g. Redis was unreachable for a whole
			// lease). Cutting the answer off would hurt the user more than
			// a briefly exceeded limit, so the stream goes on; the limit
			// heals when it ends.
			log.Warn("permit lease lost while streaming", "pool", in.Pool)
			warned = true
		}
	}
}

// StopStream raises the stop flag that a running LLM stream checks with
// every token.
func (a *Chat) StopStream(ctx context.Context, in StopStreamInput) error {
	if err := a.Redis.Set(ctx, a.stopKey(in.RequestID), "1", a.Options.StopFlagTTL).Err(); err != nil {
		return fmt.Errorf("raise stop flag of %s: %w", in.RequestID, err)
	}
	return nil
}

// Finalize gives back the request's permit or queue place (idempotently:
// it is retried), wakes whoever that admitted, and writes the terminal event.
func (a *Chat) Finalize(ctx context.Context, in FinalizeInput) error {
	if in.StopStream {
		if err := a.StopStream(ctx, StopStreamInput{RequestID: in.RequestID}); err != nil {
			return err
		}
	}
	var pools []string
	switch {
	case in.AllPools:
		pools = a.Gate.Pools()
	case in.Pool != "":
		pools = []string{in.Pool}
	}
	for _, pool := range pools {
		rel, err := a.Gate.Release(ctx, pool, in.RequestID)
		if err != nil {
			return err
		}
		if err := admission.Wake(ctx, a.Gate, a.Notifier, pool, rel.Woken); err != nil {
			a.logger(in.RequestID).Warn("wake granted waiters", "err", err)
		}
	}
	if in.Used != nil && in.Reservation != "" && a.Limiter != nil {
		if _, err := a.Limiter.Refund(ctx, in.Reservation, float64(in.Used.Tokens), float64(in.Used.Requests)); err != nil {
			return err
		}
	}
	if in.Turn != nil && a.Sessions != nil {
		if err := a.recordTurn(ctx, in); err != nil {
			return err
		}
	}
	if in.Report != nil && activity.GetInfo(ctx).Attempt == 1 {
		// Once per request: a retried Finalize would count it again.
		a.report(*in.Report)
	}
	if in.EventType == "" {
		return nil
	}
	var data any = in.Failure
	if in.EventType == events.TypeDone {
		data = in.Done
	}
	if _, err := a.Events.Append(ctx, in.RequestID, in.EventType, data); err != nil {
		return err
	}
	return nil
}
