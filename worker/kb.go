package worker

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Chunking is how documents are cut: sizes are configured in tokens and
// counted in words, and English prose runs ~1.3 tokens a word.
func Chunking(cfg config.Retrieval) retrieval.ChunkOptions {
	overlap := cfg.ChunkOverlapTokens * 3 / 4
	if overlap == 0 {
		overlap = -1 // none
	}
	return retrieval.ChunkOptions{MaxWords: max(cfg.ChunkTokens*3/4, 10), OverlapWords: overlap}
}

// seedKnowledgeBases ingests the configured corpora (built in or from a
// directory) into the kb store. Content already stored is neither
// embedded nor written again, so every process can seed at start; documents
// added through the API are left alone.
func seedKnowledgeBases(ctx context.Context, cfg config.Config, ing *ingest.Ingester, logger *slog.Logger) error {
	for i, k := range cfg.Retrieval.KnowledgeBases {
		var docs []retrieval.Document
		var err error
		if k.Builtin != "" {
			docs, err = retrieval.Builtin(k.Builtin)
		} else {
			docs, err = retrieval.LoadDir(k.Dir)
		}
		if err != nil {
			return fmt.Errorf("retrieval.knowledge_bases[%d] (%s): %w", i, k.Name, err)
		}
		in := make([]ingest.Document, len(docs))
		for j, d := range docs {
			in[j] = ingest.Document{ID: d.ID, Title: d.Title, Text: d.Text}
		}
		res, err := ing.Put(ctx, k.Name, in)
		if err != nil {
			return fmt.Errorf("seed knowledge base %s (retrieval.knowledge_bases[%d]): %w", k.Name, i, err)
		}
		changed := 0
		for _, d := range res.Docs {
			if d.Changed {
				changed++
			}
		}
		logger.Info("seeded knowledge base", "kb", k.Name, "docs", len(in), "changed", changed, "version", res.Version)
	}
	return nil
}

// cachedRetriever adapts the L2 cache to the activities' interface.
type cachedRetriever struct{ c *retrieval.CachedRetriever }

func (r cachedRetriever) Retrieve(ctx context.Context, q retrieval.Query) (retrieval.Result, bool, error) {
	return r.c.Get(ctx, q)
}
