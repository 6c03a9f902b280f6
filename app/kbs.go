package app

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"golang.org/x/sync/singleflight"
)

// seedKnowledgeBases ingests the configured corpora (built in or from a
// directory) into the kb store. Content already stored is neither
// embedded nor written again, so every process can seed at start; documents
// added through the API are left alone.
func seedKnowledgeBases(ctx context.Context, cfg config.Config, ing *ingest.Ingester, logger *slog.Logger) error {
	for i := range cfg.Retrieval.KnowledgeBases {
		if err := seedKnowledgeBase(ctx, cfg, i, ing, logger); err != nil {
			return err
		}
	}
	return nil
}

// seedKnowledgeBase ingests the i-th configured corpus.
func seedKnowledgeBase(ctx context.Context, cfg config.Config, i int, ing *ingest.Ingester, logger *slog.Logger) error {
	k := cfg.Retrieval.KnowledgeBases[i]
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
	res, err := ing.Put(ctx, kbKey(k), in)
	if err != nil {
		return fmt.Errorf("seed knowledge base %s (retrieval.knowledge_bases[%d]): %w", k.Name, i, err)
	}
	changed := 0
	for _, d := range res.Docs {
		if d.Changed {
			changed++
		}
	}
	logger.Info("seeded knowledge base", "kb", kbKey(k), "docs", len(in), "changed", changed, "version", res.Version)
	return nil
}

// kbKeeper seeds a configured knowledge base again when Redis lost it (it
// restarted empty), so that a routine Redis restart is a blip rather than
// "unknown knowledge base" until every worker restarts. It checks every
// configured kb every keeperInterval, and at once when a request finds
// one missing (Restore). Knowledge bases ingested through the API alone
// are the operator's to restore.
type kbKeeper struct {
	cfg    config.Config
	ing    *ingest.Ingester
	store  *kbstore.Store
	logger *slog.Logger
	group  singleflight.Group
}

// kbKey is a configured kb's key: a shared kb has no tenant.
func kbKey(k config.KnowledgeBase) string {
	return kbref.Ref{Tenant: k.Tenant, Name: k.Name}.Key()
}

// keeperInterval is how often the configured kbs are checked.
const keeperInterval = 5 * time.Second

// Restore seeds kb (a kbref key) again if it is configured and missing,
// and reports whether it is there now. Concurrent calls for one kb seed
// it once.
func (k *kbKeeper) Restore(ctx context.Context, kb string) (bool, error) {
	i := slices.IndexFunc(k.cfg.Retrieval.KnowledgeBases, func(c config.KnowledgeBase) bool { return kbKey(c) == kb })
	if i < 0 {
		return false, nil
	}
	_, err, _ := k.group.Do(kb, func() (any, error) {
		head, err := k.store.Head(ctx, kb)
		if err != nil || head.Version > 0 {
			return nil, err
		}
		k.logger.Warn("configured knowledge base is missing from Redis; seeding it again", "kb", kb)
		return nil, seedKnowledgeBase(context.WithoutCancel(ctx), k.cfg, i, k.ing, k.logger)
	})
	return err == nil, err
}

// run checks the configured kbs until ctx ends.
func (k *kbKeeper) run(ctx context.Context) {
	t := time.NewTicker(keeperInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, c := range k.cfg.Retrieval.KnowledgeBases {
			if _, err := k.Restore(ctx, kbKey(c)); err != nil && ctx.Err() == nil {
				k.logger.Warn("check configured knowledge base", "kb", kbKey(c), "err", err)
			}
		}
	}
}

// cachedRetriever adapts the L2 cache to the activities' interface.
type cachedRetriever struct{ c *retrieval.CachedRetriever }

func (r cachedRetriever) Retrieve(ctx context.Context, q retrieval.Query) (retrieval.Result, bool, error) {
	return r.c.Get(ctx, q)
}
