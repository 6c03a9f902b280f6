// Package worker wires Sluice from its configuration: Redis, the Temporal
// client, the admission gate, caches, LLM pools and the activities, and runs
// the Temporal worker that executes chat workflows. The API process uses the
// same wiring (and an embedded worker, for eager workflow start).
package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/answercache"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/pkg/usage"
	"github.com/sluice-dev/sluice/workflows"
	"github.com/sluice-dev/sluice/workflows/signal"
)

// Runtime is what a Sluice process needs, built once from config.
type Runtime struct {
	Config   config.Config
	Logger   *slog.Logger
	Redis    redis.UniversalClient
	Temporal client.Client
	Events   *events.Log
	Gate     *admission.Gate
	// Policy is the live traffic policy the door and the healer share. The
	// API process polls it (Store.Run); the healer refreshes it before
	// each change.
	Policy *policy.Store
	// Waker is nil when admission.fast_wait is 0.
	Waker   *admission.Waker
	Tokens  *tokens.Counter
	Prompts *prompt.Builder
	Limiter *limiter.Limiter
	// KBs holds the knowledge bases; Ingester writes documents into it.
	KBs *kbstore.Store
	// keeper seeds configured kbs again when Redis lost them.
	keeper   *kbKeeper
	Ingester *ingest.Ingester
	// Sessions keeps conversations (/v1/chat session_id).
	Sessions *session.Store
	// Metrics is the process's Prometheus registry; Latency the window of
	// stage latencies shared with every other instance through Redis.
	Metrics *metrics.Metrics
	Latency *latency.Window
	Chat    *activities.Chat
	// EmbedCache is the embedder behind its cache tier, which the API
	// serves embeddings through.
	EmbedCache *embed.Cache
	// Healing holds the healing workflow's activities.
	Healing *activities.Healing
	// restart notices a Redis that lost Sluice's state (the janitor's).
	restart restartWatch
	// Tracer traces requests through Redis, Temporal and the LLM
	// backends; nil when tracing is off (pkg/tracing).
	Tracer trace.TracerProvider
	// Codec seals workflow payloads (nil: codec.enabled is false); the
	// API serves it to operators at /codec.
	Codec *codec.Keyring
	// Usage is the usage ledger (nil: usage.store is off).
	Usage usage.Store
	// Budgets counts the tiers' monthly budgets (limits.tiers.*.budget).
	Budgets *budget.Counter
}

// NewLogger builds the process logger from config.
func NewLogger(cfg config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(cfg.Level)))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// NewRuntime connects to Redis and Temporal and builds every component.
// It fails fast, naming what it could not reach.
func NewRuntime(ctx context.Context, cfg config.Config, logger *slog.Logger) (_ *Runtime, err error) {
	r := &Runtime{Config: cfg, Logger: logger, Metrics: metrics.New(logger.With("component", "metrics")), Tracer: tracing.Provider()}
	// Before RegisterPools, whose collector reads the tenants' backlogs.
	r.Metrics.TrackTenants(cfg.Metrics.TenantSeries)
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if err := r.connectRedis(ctx); err != nil {
		return nil, err
	}
	if r.Tokens, err = tokens.For(cfg.Routing.Encoding); err != nil {
		return nil, err
	}
	r.Prompts = prompt.NewBuilder(cfg.LLM.SystemPrompt, r.Tokens)
	if err := r.buildRedisStores(ctx); err != nil {
		return nil, err
	}
	if err := r.connectTemporal(); err != nil {
		return nil, err
	}
	r.registerDependencyMetrics()
	if r.Usage, err = OpenUsage(ctx, cfg.Usage, logger.With("component", "usage")); err != nil {
		return nil, err
	}
	r.Budgets = NewBudgets(r.Redis, cfg, r.Usage)
	if r.Chat, err = r.buildChat(ctx); err != nil {
		return nil, err
	}
	if r.Healing, err = r.buildHealing(); err != nil {
		return nil, err
	}
	return r, nil
}

// buildRedisStores builds what lives in Redis: the rate limiter, the event
// log, the latency window, sessions, the admission gate (with its metrics)
// and, when admission.fast_wait is set, the grant waker.
func (r *Runtime) buildRedisStores(ctx context.Context) error {
	cfg := r.Config
	// A reservation lives as long as the longest request: the longest
	// queue wait plus every LLM attempt, with room to spare.
	r.Limiter = limiter.New(r.Redis, limiter.Options{
		KeyPrefix:      cfg.Redis.KeyPrefix,
		ReservationTTL: longestWait(cfg) + cfg.LLM.Timeout*time.Duration(cfg.LLM.MaxAttempts) + 10*time.Minute,
		// Concurrent decisions at the door share script calls: under a
		// flood this multiplies what one Redis decides per second
		// (sluice-bench limiter); idle, a request goes alone at once.
		Batchers: 2,
		MaxBatch: 64,
		// Every caller is a request at the door, which promises a 503
		// within redis.request_timeout when Redis stalls; a caller waits
		// for its batch's call, so the call must be bounded by that too.
		BatchTimeout: cfg.Redis.RequestTimeout,
	})
	r.Events = events.NewLog(r.Redis, events.LogOptions{KeyPrefix: cfg.Redis.KeyPrefix, TTL: cfg.Events.TTL, MaxLen: cfg.Events.MaxLen})
	var err error
	r.Latency, err = latency.New(r.Redis, latency.Options{
		KeyPrefix: cfg.Redis.KeyPrefix, Slot: cfg.Metrics.LatencySlot, Retention: cfg.Metrics.LatencyRetention,
		Logger: r.Logger.With("component", "latency"),
	})
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	r.Sessions, err = session.New(r.Redis, session.Options{KeyPrefix: cfg.Redis.KeyPrefix, TTL: cfg.Sessions.TTL, MaxTurns: cfg.Sessions.MaxTurns})
	if err != nil {
		return fmt.Errorf("sessions: %w", err)
	}
	gateOpts := GateOptions(cfg)
	// Every permit this process gives back is counted here, whichever
	// path gives it back.
	gateOpts.Holds = r.Metrics
	r.Gate, err = admission.New(r.Redis, gateOpts)
	if err != nil {
		return err
	}
	r.Policy = NewPolicy(r.Redis, cfg, r.Gate, r.Logger.With("component", "policy"))
	r.registerQueueMetrics()
	if cfg.Admission.FastWait > 0 {
		if r.Waker, err = admission.NewWaker(ctx, r.Redis, r.Gate); err != nil {
			return err
		}
	}
	return nil
}

// GateOptions is the admission gate cfg asks for: a permit count per
// pool and, when the pools share their servers, one budget for both.
func GateOptions(cfg config.Config) admission.Options {
	limits := map[string]int{}
	for name, p := range cfg.Pools.ByName() {
		limits[name] = p.MaxConcurrency
	}
	var groups []admission.Group
	if n := cfg.Pools.SharedLimit(); n > 0 {
		groups = []admission.Group{{Pools: request.Pools(), Limit: n}}
	}
	return admission.Options{
		KeyPrefix:     cfg.Redis.KeyPrefix,
		Lease:         cfg.Admission.Lease,
		WaiterTTL:     WaiterTTL(cfg.Admission),
		MaxQueueDepth: cfg.Admission.MaxQueueDepth,
		Limits:        limits,
		Groups:        groups,
	}
}

// registerQueueMetrics exposes the pools' permits and queues, each
// tenant's backlog in them, and the tiers' weights, which the fairness
// rules divide each tenant's service by.
func (r *Runtime) registerQueueMetrics() {
	r.Metrics.RegisterPools(r.Gate.Pools(), func(ctx context.Context, pool string) (metrics.PoolStats, error) {
		st, err := r.Gate.QueueStats(ctx, pool)
		return metrics.PoolStats{InUse: st.InUse, Limit: st.Limit, Waiting: st.Waiting, OldestWait: st.OldestWait, Backlog: st.Backlog()}, err
	})
	r.Metrics.RegisterTierWeights(func() map[string]int {
		tiers := r.Policy.Current().Limits.Tiers
		weights := make(map[string]int, len(tiers))
		for name, t := range tiers {
			weights[name] = t.Weight
		}
		return weights
	})
}

// longestWait is the longest any tier may wait in the queue.
func longestWait(cfg config.Config) time.Duration {
	w := max(cfg.Admission.MaxWait, cfg.Pools.Short.MaxWait, cfg.Pools.Long.MaxWait)
	for _, t := range cfg.Limits.Tiers {
		w = max(w, t.MaxWait)
	}
	return w
}

// WaiterTTL is how long a queue entry stays live between its waiter's
// re-checks: three missed re-checks mark it a zombie.
func WaiterTTL(a config.Admission) time.Duration {
	return admission.AliveFor(a.RecheckInterval)
}

// buildChat builds the chat activities: the embedder and its cache, the
// knowledge bases (seeded from config), the retriever and its cache, the
// reranker, the answer cache and the LLM pools.
func (r *Runtime) buildChat(ctx context.Context) (*activities.Chat, error) {
	cfg := r.Config
	embedder, err := newEmbedder(cfg.Embedding, r.Tracer)
	if err != nil {
		return nil, err
	}
	reranker, err := newReranker(cfg.Rerank, r.Tracer)
	if err != nil {
		return nil, err
	}
	keepCase := caseSensitive(cfg.Embedding)
	embCache := embed.NewCache(embedder, r.Redis, embed.CacheOptions{
		Prefix: cfg.Redis.KeyPrefix, TTL: cfg.Embedding.CacheTTL, LRUSize: cfg.Embedding.LRUSize,
		KeepCase: keepCase,
		Logger:   r.Logger.With("component", "embed-cache"),
	})
	r.KBs = kbstore.New(r.Redis, kbstore.Options{Prefix: cfg.Redis.KeyPrefix, MaxKBMemory: cfg.Retrieval.KBMemoryBytes})
	r.Ingester = &ingest.Ingester{Store: r.KBs, Embedder: embedder, Chunking: Chunking(cfg.Retrieval),
		MaxMetadataBytes: cfg.Ingest.MaxMetadataBytes}
	r.keeper = &kbKeeper{cfg: cfg, ing: r.Ingester, store: r.KBs, logger: r.Logger.With("component", "kb-keeper")}
	if err := seedKnowledgeBases(ctx, cfg, r.Ingester, r.Logger); err != nil {
		return nil, err
	}
	live, err := retrieval.NewLive(r.KBs, retrieval.LiveOptions{Model: embedder.Model(), MemoryBudget: cfg.Retrieval.KBMemoryBytes,
		Logger: r.Logger.With("component", "kb")})
	if err != nil {
		return nil, err
	}
	r.Metrics.RegisterKBMemory(func() metrics.KBMemory {
		s := live.MemoryStats()
		return metrics.KBMemory{Budget: s.Budget, Loaded: s.Loaded, KBs: s.KBs, Loads: s.Loads, Evictions: s.Evictions, Refused: s.Refused}
	})
	cached := retrieval.NewCachedRetriever(live, r.Redis, retrieval.CacheOptions{
		Prefix: cfg.Redis.KeyPrefix, TTL: cfg.Retrieval.CacheTTL,
		Version: embedder.Model(),
		// The key's text must be what was embedded: with a case-sensitive
		// embedder, "Redis" and "redis" have different vectors.
		KeepCase:    keepCase,
		DocIndexKey: r.KBs.L2DocKey,
		VersionKey:  r.KBs.VersionKey,
		// Retrieve hands on chunk refs; rerank looks the text up by ID.
		RefsOnly: true,
		Logger:   r.Logger.With("component", "retrieval-cache"),
	})
	answers := answercache.New(r.Redis, cfg.Redis.KeyPrefix, cfg.AnswerCache.TTL)
	r.EmbedCache = embCache
	r.registerCacheMetrics(embCache, cached, answers)
	pools, err := r.llmPools(cfg.Pools)
	if err != nil {
		return nil, err
	}
	notifier := signal.Notifier{Client: r.Temporal}
	return &activities.Chat{
		Redis:    r.Redis,
		Events:   r.Events,
		Gate:     r.Gate,
		Notifier: notifier,
		Returner: &holdings.Returner{Gate: r.Gate, Notifier: notifier, Limiter: r.Limiter, Budgets: r.Budgets,
			Logger: r.Logger.With("component", "holdings")},
		Waker:      r.Waker,
		Embeddings: embCache,
		Retriever:  cachedRetriever{cached},
		Chunks:     live,
		KBs:        r.keeper,
		Reranker:   reranker,
		Pools:      pools,
		Prompts:    r.Prompts,
		Limiter:    r.Limiter,
		Sessions:   r.Sessions,
		Answers:    answers,
		Metrics:    r.Metrics,
		Latency:    r.Latency,
		KBVersions: r.KBs,
		Usage:      r.Usage,
		Budgets:    r.Budgets,
		Logger:     r.Logger.With("component", "activities"),
		Options: activities.Options{
			ShortThreshold: cfg.Routing.ShortThresholdTokens, OutputTokenWeight: cfg.Admission.OutputTokenWeight,
			TopK:        cfg.Retrieval.TopK,
			ChunkTokens: cfg.Retrieval.ChunkTokens,
			StopFlagTTL: 10 * time.Minute,
			// The notice is a token event: every client shows it.
			TruncationNotice: cfg.LLM.TruncationNotice,
		},
	}, nil
}

// llmPools builds a streaming client for each pool, and exposes its
// endpoints' circuits.
func (r *Runtime) llmPools(cfg config.Pools) (map[string]activities.Pool, error) {
	pools := map[string]activities.Pool{}
	clients := map[string]*llm.OpenAI{}
	for name, p := range cfg.ByName() {
		c, err := llm.NewOpenAI(llm.OpenAIOptions{
			Name: name, Endpoints: p.Endpoints, APIKey: p.APIKey,
			Deadlines: llm.Deadlines{Connect: p.ConnectTimeout, FirstToken: p.FirstTokenTimeout, TokenIdle: p.TokenIdleTimeout},
			Breaker:   llm.Breaker{Failures: p.Breaker.Failures, OpenFor: p.Breaker.OpenFor, SlowFirstToken: p.Breaker.SlowFirstToken},
			Logger:    r.Logger.With("component", "llm"), Tracer: r.Tracer,
			Continuation: p.Continuation, MaxFailovers: p.MaxFailovers,
		})
		if err != nil {
			return nil, fmt.Errorf("pools.%s: %w", name, err)
		}
		pools[name] = activities.Pool{Streamer: c, Model: p.Model, MaxPromptTokens: p.MaxPromptTokens,
			Continues: p.Continuation == config.ContinuationVLLM, Endpoints: len(p.Endpoints)}
		clients[name] = c
	}
	r.Metrics.RegisterBackends(func() []metrics.Circuit {
		var out []metrics.Circuit
		for pool, client := range clients {
			for _, c := range client.Circuits() {
				out = append(out, metrics.Circuit{Pool: pool, Endpoint: c.Endpoint, State: int(c.State)})
			}
		}
		return out
	})
	return pools, nil
}

// registerCacheMetrics exposes each cache tier's hits, misses and size.
func (r *Runtime) registerCacheMetrics(emb *embed.Cache, l2 *retrieval.CachedRetriever, answers *answercache.Cache) {
	r.Metrics.RegisterCache("embedding", func() metrics.CacheStats {
		s := emb.Stats()
		return metrics.CacheStats{Hits: s.MemoryHits + s.RedisHits, Misses: s.Misses, Bytes: s.Bytes}
	})
	r.Metrics.RegisterCache("retrieval", func() metrics.CacheStats {
		s := l2.Stats()
		return metrics.CacheStats{Hits: s.Hits, Misses: s.Misses, Bytes: s.Bytes}
	})
	r.Metrics.RegisterCache("answer", func() metrics.CacheStats {
		s := answers.Stats()
		return metrics.CacheStats{Hits: uint64(s.Hits), Misses: uint64(s.Misses), Bytes: uint64(s.Bytes)}
	})
}

// registerDependencyMetrics exposes whether Redis and Temporal answer
// this process, checked as /readyz checks them.
func (r *Runtime) registerDependencyMetrics() {
	r.Metrics.RegisterDependency("redis", func(ctx context.Context) error { return r.Redis.Ping(ctx).Err() })
	r.Metrics.RegisterDependency("temporal", func(ctx context.Context) error {
		_, err := r.Temporal.CheckHealth(ctx, &client.CheckHealthRequest{})
		return err
	})
}

// Close releases connections.
func (r *Runtime) Close() {
	if r.Limiter != nil {
		r.Limiter.Close()
	}
	if r.Waker != nil {
		_ = r.Waker.Close()
	}
	if r.Temporal != nil {
		r.Temporal.Close()
	}
	if r.Redis != nil {
		_ = r.Redis.Close()
	}
	if r.Usage != nil {
		_ = r.Usage.Close()
	}
}

// NewWorker returns a Temporal worker with the chat workflow and its
// activities registered.
func (r *Runtime) NewWorker() worker.Worker {
	cfg := r.Config.Temporal
	// The cache is the process's, shared by its workers and sized when
	// the first of them is made: without a bound of our own it is the
	// SDK's 10,000 workflows, which the API's embedded worker fills with
	// workflows that went on to finish on other workers, each holding its
	// state and goroutines until pushed out.
	worker.SetStickyWorkflowCacheSize(r.Config.WorkflowCacheSize())
	w := worker.New(r.Temporal, cfg.TaskQueue, worker.Options{
		MaxConcurrentActivityExecutionSize:      cfg.MaxConcurrentActivities,
		MaxConcurrentWorkflowTaskExecutionSize:  cfg.MaxConcurrentWorkflowTasks,
		MaxConcurrentLocalActivityExecutionSize: 1000,
		WorkerStopTimeout:                       cfg.WorkerStopTimeout,
		// A request that failed because Redis or another dependency was
		// out of reach is told to retry, not that Sluice failed.
		Interceptors: []interceptor.WorkerInterceptor{activities.UnavailableInterceptor()},
	})
	Register(w, r.Chat, r.Healing)
	return w
}

// Register registers Sluice's workflows and activities on w. Activities
// are named by their method names, so Chat's and Healing's must not
// collide (registering would panic).
func Register(w worker.Registry, acts *activities.Chat, healing *activities.Healing) {
	w.RegisterWorkflowWithOptions(workflows.ChatWorkflow, workflow.RegisterOptions{Name: workflows.ChatWorkflowName})
	w.RegisterWorkflowWithOptions(workflows.HealingWorkflow, workflow.RegisterOptions{Name: workflows.HealingWorkflowName})
	w.RegisterActivity(acts)
	if healing != nil {
		w.RegisterActivity(healing)
	}
}

// Run runs the worker, the admission janitor and the latency window's
// flusher until ctx ends.
func (r *Runtime) Run(ctx context.Context) error {
	// The window stops after the worker (defers run last first), so that
	// requests the worker finishes while stopping are flushed too.
	lctx, stopLatency := context.WithCancel(context.WithoutCancel(ctx))
	flushed := make(chan error, 1)
	go func() { flushed <- r.Latency.Run(lctx) }()
	defer func() {
		stopLatency()
		if err := <-flushed; err != nil {
			r.Logger.Warn("last latency flush", "err", err)
		}
	}()
	w := r.NewWorker()
	if err := w.Start(); err != nil {
		return fmt.Errorf("start temporal worker on %s: %w", r.Config.Temporal.TaskQueue, err)
	}
	defer w.Stop()
	r.Logger.Info("worker started", "taskQueue", r.Config.Temporal.TaskQueue, "temporal", r.Config.Temporal.HostPort)
	// A healer that cannot start is logged, not fatal: chat requests do
	// not need it, and the next worker start tries again.
	if err := StartHealing(ctx, r.Temporal, r.Config, r.Logger); err != nil {
		r.Logger.Error("start the healer", "err", err)
	}
	go r.keeper.run(ctx)
	r.runJanitor(ctx)
	return nil
}

// runJanitor reclaims expired permits every second and wakes the waiters
// they go to; without it a crashed holder's slot would sit idle until the
// next release or the waiters' own re-check.
func (r *Runtime) runJanitor(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.checkRedisState(ctx)
			for _, pool := range r.Gate.Pools() {
				woken, err := r.Gate.Pump(ctx, pool)
				if err != nil {
					if ctx.Err() == nil {
						r.Logger.Warn("admission janitor", "pool", pool, "err", err)
					}
					continue
				}
				if err := admission.Wake(ctx, r.Gate, r.Chat.Notifier, woken); err != nil {
					r.Logger.Warn("admission janitor wake", "pool", pool, "err", err)
				}
			}
		}
	}
}
