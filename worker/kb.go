package worker

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// loadKnowledgeBases loads every configured kb, embeds its chunks and
// agrees on its version with the other instances through Redis.
func loadKnowledgeBases(ctx context.Context, cfg config.Config, emb embed.Embedder, rdb *redis.Client, logger *slog.Logger) (*retrieval.Hybrid, error) {
	versions := retrieval.NewVersions(rdb, cfg.Redis.KeyPrefix)
	// Chunk sizes are counted in words; English prose runs ~1.3 tokens a
	// word, so this keeps chunks within retrieval.chunk_tokens.
	maxWords := max(cfg.Retrieval.ChunkTokens*3/4, 10)
	var kbs []*retrieval.KB
	for i, k := range cfg.Retrieval.KnowledgeBases {
		var docs []retrieval.Document
		var err error
		if k.Builtin != "" {
			docs, err = retrieval.Builtin(k.Builtin)
		} else {
			docs, err = retrieval.LoadDir(k.Dir)
		}
		if err != nil {
			return nil, fmt.Errorf("retrieval.knowledge_bases[%d] (%s): %w", i, k.Name, err)
		}
		kb, err := retrieval.NewKB(ctx, k.Name, docs, retrieval.KBOptions{
			Embedder: emb,
			Chunking: retrieval.ChunkOptions{MaxWords: maxWords},
			Versions: versions,
			Logger:   logger.With("component", "kb"),
		})
		if err != nil {
			return nil, fmt.Errorf("load knowledge base %s: %w", k.Name, err)
		}
		kbs = append(kbs, kb)
	}
	return retrieval.NewHybrid(retrieval.HybridOptions{}, kbs...)
}

// cachedRetriever adapts the L2 cache to the activities' interface.
type cachedRetriever struct{ c *retrieval.CachedRetriever }

func (r cachedRetriever) Retrieve(ctx context.Context, q retrieval.Query) (retrieval.Result, bool, error) {
	return r.c.Get(ctx, q)
}
