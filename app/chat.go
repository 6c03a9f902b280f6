package app

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/answercache"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// buildChat builds the chat activities: the embedder and its cache, the
// knowledge bases (seeded from config), the retriever and its cache, the
// reranker, the answer cache and the LLM pools.
func (c *Core) buildChat(ctx context.Context) (*activities.Chat, error) {
	cfg := c.cfg
	embedder, err := newEmbedder(cfg.Embedding, c.Tracer)
	if err != nil {
		return nil, err
	}
	reranker, err := newReranker(cfg.Rerank, c.Tracer)
	if err != nil {
		return nil, err
	}
	embCache := embed.NewCache(embedder, c.Redis, embed.CacheOptions{
		Prefix: cfg.Redis.KeyPrefix, TTL: cfg.Embedding.CacheTTL, LRUSize: cfg.Embedding.LRUSize,
		KeepCase: caseSensitive(cfg.Embedding),
		Logger:   c.logger.With("component", "embed-cache"),
	})
	c.KBs = kbstore.New(c.Redis, kbstore.Options{Prefix: cfg.Redis.KeyPrefix, MaxKBMemory: cfg.Retrieval.KBMemoryBytes})
	c.Ingester = &ingest.Ingester{Store: c.KBs, Embedder: embedder,
		Chunking:         retrieval.ChunkingFor(cfg.Retrieval.ChunkTokens, cfg.Retrieval.ChunkOverlapTokens),
		MaxMetadataBytes: cfg.Ingest.MaxMetadataBytes}
	c.keeper = &kbKeeper{cfg: cfg, ing: c.Ingester, store: c.KBs, logger: c.logger.With("component", "kb-keeper")}
	if err := seedKnowledgeBases(ctx, cfg, c.Ingester, c.logger); err != nil {
		return nil, err
	}
	live, cached, err := c.buildRetrieval(embedder.Model())
	if err != nil {
		return nil, err
	}
	answers := answercache.New(c.Redis, cfg.Redis.KeyPrefix, cfg.AnswerCache.TTL)
	c.EmbedCache = embCache
	c.registerCacheMetrics(embCache, cached, answers)
	pools, err := c.llmPools(cfg.Pools)
	if err != nil {
		return nil, err
	}
	chat := &activities.Chat{
		Redis:    c.Redis,
		Events:   c.Events,
		Gate:     c.Gate,
		Notifier: c.Notifier,
		Returner: &holdings.Returner{Gate: c.Gate, Notifier: c.Notifier, Limiter: c.Limiter, Budgets: c.Budgets,
			Metrics: c.Metrics, Logger: c.logger.With("component", "holdings")},
		Waker:      c.Waker,
		Asker:      c.Asker,
		Embeddings: embCache,
		Retriever:  cachedRetriever{cached},
		Chunks:     live,
		KBs:        c.keeper,
		Reranker:   reranker,
		Pools:      pools,
		Prompts:    c.Prompts,
		Limiter:    c.Limiter,
		Sessions:   c.Sessions,
		Answers:    answers,
		Metrics:    c.Metrics,
		Latency:    c.Latency,
		KBVersions: c.KBs,
		Usage:      c.Usage,
		Budgets:    c.Budgets,
		Logger:     c.logger.With("component", "activities"),
		Options: activities.Options{
			ShortThreshold: cfg.Routing.ShortThresholdTokens, OutputTokenWeight: cfg.Admission.OutputTokenWeight,
			TopK:        cfg.Retrieval.TopK,
			ChunkTokens: cfg.Retrieval.ChunkTokens,
			StopFlagTTL: 10 * time.Minute,
			// The notice is a token event: every client shows it.
			TruncationNotice: cfg.LLM.TruncationNotice,
			Preemption: activities.Preemption{Enabled: cfg.Admission.Preemption.Enabled, From: pausesFor(cfg.Pools),
				PauseRules: PauseRules(cfg)},
		},
	}
	if c.Responses != nil {
		// Not a nil *Store in the interface: the activity tells off by nil.
		chat.Responses = c.Responses
	}
	return chat, nil
}

// buildRetrieval builds the kbs' search over the embedder model's vectors
// (loaded within retrieval.kb_memory_bytes) and its L2 cache.
func (c *Core) buildRetrieval(model string) (*retrieval.Live, *retrieval.CachedRetriever, error) {
	cfg := c.cfg
	live, err := retrieval.NewLive(c.KBs, retrieval.LiveOptions{Model: model, MemoryBudget: cfg.Retrieval.KBMemoryBytes,
		Logger: c.logger.With("component", "kb")})
	if err != nil {
		return nil, nil, err
	}
	c.Metrics.RegisterKBMemory(func() metrics.KBMemory {
		s := live.MemoryStats()
		return metrics.KBMemory{Budget: s.Budget, Loaded: s.Loaded, Reserved: s.Reserved, KBs: s.KBs, Loads: s.Loads, Evictions: s.Evictions, Refused: s.Refused}
	})
	cached := retrieval.NewCachedRetriever(live, c.Redis, retrieval.CacheOptions{
		Prefix: cfg.Redis.KeyPrefix, TTL: cfg.Retrieval.CacheTTL,
		Version: model,
		// The key's text must be what was embedded: with a case-sensitive
		// embedder, "Redis" and "redis" have different vectors.
		KeepCase:    caseSensitive(cfg.Embedding),
		DocIndexKey: c.KBs.L2DocKey,
		VersionKey:  c.KBs.VersionKey,
		// Retrieve hands on chunk refs; rerank looks the text up by ID.
		RefsOnly: true,
		Logger:   c.logger.With("component", "retrieval-cache"),
	})
	return live, cached, nil
}

// llmPools builds a streaming client for each pool, and exposes its
// endpoints' circuits.
func (c *Core) llmPools(cfg config.Pools) (map[string]activities.Pool, error) {
	pools := map[string]activities.Pool{}
	clients := map[string]*llm.OpenAI{}
	for name, p := range cfg.ByName() {
		cl, err := llm.NewOpenAI(llm.OpenAIOptions{
			Name: name, Endpoints: p.Endpoints, APIKey: p.APIKey,
			Deadlines: llm.Deadlines{Connect: p.ConnectTimeout, FirstToken: p.FirstTokenTimeout, TokenIdle: p.TokenIdleTimeout},
			Breaker:   llm.Breaker{Failures: p.Breaker.Failures, OpenFor: p.Breaker.OpenFor, SlowFirstToken: p.Breaker.SlowFirstToken},
			Logger:    c.logger.With("component", "llm"), Tracer: c.Tracer,
			Continuation: p.Continuation, MaxFailovers: p.MaxFailovers, Priority: p.Priority,
		})
		if err != nil {
			return nil, fmt.Errorf("pools.%s: %w", name, err)
		}
		pools[name] = activities.Pool{Streamer: cl, Model: p.Model, MaxPromptTokens: p.MaxPromptTokens,
			Continues: p.Continues(), Endpoints: len(p.Endpoints)}
		clients[name] = cl
	}
	c.Metrics.RegisterBackends(func() []metrics.Circuit {
		var out []metrics.Circuit
		for pool, client := range clients {
			for _, cc := range client.Circuits() {
				out = append(out, metrics.Circuit{Pool: pool, Endpoint: cc.Endpoint, State: int(cc.State)})
			}
		}
		return out
	})
	return pools, nil
}

// registerCacheMetrics exposes each cache tier's hits, misses and size.
func (c *Core) registerCacheMetrics(emb *embed.Cache, l2 *retrieval.CachedRetriever, answers *answercache.Cache) {
	c.Metrics.RegisterCache("embedding", func() metrics.CacheStats {
		s := emb.Stats()
		return metrics.CacheStats{Hits: s.MemoryHits + s.RedisHits, Misses: s.Misses, Bytes: s.Bytes}
	})
	c.Metrics.RegisterCache("retrieval", func() metrics.CacheStats {
		s := l2.Stats()
		return metrics.CacheStats{Hits: s.Hits, Misses: s.Misses, Bytes: s.Bytes}
	})
	c.Metrics.RegisterCache("answer", func() metrics.CacheStats {
		s := answers.Stats()
		return metrics.CacheStats{Hits: uint64(s.Hits), Misses: uint64(s.Misses), Bytes: uint64(s.Bytes)}
	})
}
