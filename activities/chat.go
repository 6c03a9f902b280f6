// Package activities holds the side effects of a chat request: cache
// lookups, admission, retrieval, rerank, the streamed LLM call and the final
// release. Fast steps run as local activities; the LLM stream is a regular
// activity so that it survives a worker crash (it heartbeats).
package activities

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/answercache"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/rerank"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/usage"
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

// KBRestorer seeds a configured knowledge base again when Redis lost it,
// and reports whether it is there now (false: not a configured kb).
type KBRestorer interface {
	Restore(ctx context.Context, kb string) (bool, error)
}

// KBVersions reads a knowledge base's current version.
type KBVersions interface {
	Version(ctx context.Context, kb string) (int64, error)
}

// Pool is one LLM pool's client.
type Pool struct {
	Streamer        llm.Streamer
	Model           string
	MaxPromptTokens int
	// Continues: the pool's backend continues an answer (llm.Resume), so
	// that a retried stream takes up what a lost attempt began.
	Continues bool
	// Endpoints is how many endpoints the pool spreads streams over: a
	// first token that misses its deadline on that many attempts (or on
	// the last attempt) has missed it on every endpoint.
	Endpoints int
}

// Chat holds every dependency of the chat activities. Register one
// value with the worker; workflows name its methods through a nil pointer.
type Chat struct {
	Redis    redis.UniversalClient
	Events   *events.Log
	Gate     *admission.Gate
	Notifier admission.Notifier
	// Returner gives back what a finalized request holds; its Gate,
	// Notifier, Limiter and Budgets are these.
	Returner *holdings.Returner
	// Waker, when set, lets a request whose turn is near wait for its
	// grant in Admit (AdmitInput.FastWait).
	Waker *admission.Waker
	// Asker, when set, keeps asking for a stream to pause for an urgent
	// request queued here (admission.preemption); else it asks once.
	Asker      *admission.Asker
	Embeddings EmbeddingCache
	Retriever  Retriever
	Chunks     ChunkStore
	// KBs, when set, restores configured kbs that Redis lost.
	KBs      KBRestorer
	Reranker rerank.Reranker
	Pools    map[string]Pool
	Prompts  *prompt.Builder
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
	// Usage is the usage ledger (RecordUsage); nil: usage.store is off.
	Usage usage.Store
	// Responses keeps stored responses (StoreResponse); nil:
	// responses.store is off.
	Responses ResponseStore
	// Budgets settles the monthly budgets the door charged (nil: none).
	Budgets *budget.Counter
	Logger  *slog.Logger
	Options Options
}

// Options are the activity settings taken from config.
type Options struct {
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
	// OutputTokenWeight is admission.output_token_weight: a request's
	// output tokens count this many times in its admission cost, and so
	// in the cost it used, which settles that charge (usedCost).
	OutputTokenWeight float64
	// Preemption is admission.preemption: whether streams of a less
	// urgent class are paused for a more urgent waiter, and how often.
	Preemption Preemption
}

// Preemption is admission.preemption as the activities use it.
type Preemption struct {
	Enabled bool
	// From holds the pools whose waiters may have a stream paused for
	// them (config.Pools.PausesFor).
	From map[string]bool
	admission.PauseRules
}

// usedCost is the admission cost of what a request used, weighted as its
// charge was (admission.output_token_weight), for settling that charge.
func (o Options) usedCost(prompt, completion int) float64 {
	w := o.OutputTokenWeight
	if w <= 0 {
		w = 1
	}
	return admission.TokenCost(prompt + int(w*float64(completion)+0.5))
}

func (a *Chat) logger(requestID string) *slog.Logger {
	return a.Logger.With("requestID", requestID)
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
