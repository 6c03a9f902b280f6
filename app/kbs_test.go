package app

import (
	"context"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// A configured kb that Redis lost (it restarted empty) is seeded again
// (concurrent askers share one seeding) in a new epoch; a kb nobody
// configured is not. A tenant's configured kb is seeded into its own
// namespace.
func TestKeeperRestoresConfiguredKBs(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default()
	cfg.Retrieval.KnowledgeBases = append(cfg.Retrieval.KnowledgeBases, config.KnowledgeBase{Name: "handbook", Tenant: "acme", Builtin: "sluice-docs"})
	own := kbref.Own("acme", "handbook").Key()
	rdb := srv.Client(t)
	store := kbstore.New(rdb, kbstore.Options{Prefix: testenv.KeyPrefix(t)})
	ing := &ingest.Ingester{Store: store, Embedder: embed.NewLocal(embed.LocalOptions{Dims: cfg.Embedding.Dims}), Chunking: retrieval.ChunkingFor(cfg.Retrieval.ChunkTokens, cfg.Retrieval.ChunkOverlapTokens)}
	k := &kbKeeper{cfg: cfg, ing: ing, store: store, logger: quiet}
	kb := cfg.Retrieval.KnowledgeBases[0].Name

	if err := seedKnowledgeBases(ctx, cfg, ing, quiet); err != nil {
		t.Fatal(err)
	}
	before, err := store.Head(ctx, kb)
	if err != nil || before.Version == 0 {
		t.Fatalf("seeded head %+v %v", before, err)
	}
	keys, _ := rdb.Keys(ctx, testenv.KeyPrefix(t)+"*").Result()
	if err := rdb.Del(ctx, keys...).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if ok, err := k.Restore(ctx, kb); !ok || err != nil {
				t.Errorf("restore %s: %v %v", kb, ok, err)
			}
		})
	}
	wg.Wait()
	after, err := store.Head(ctx, kb)
	if err != nil || after.Version != 1 || after.Epoch == before.Epoch {
		t.Fatalf("restored head %+v (%v); want version 1 of a new epoch: seeded once", after, err)
	}
	if ok, err := k.Restore(ctx, "not-configured"); ok || err != nil {
		t.Fatalf("restore of a kb nobody configured: %v %v", ok, err)
	}
	if ok, err := k.Restore(ctx, own); !ok || err != nil {
		t.Fatalf("restore %s: %v %v", own, ok, err)
	}
	if h, _ := store.Head(ctx, own); h.Version != 1 {
		t.Fatalf("acme's configured kb: %+v", h)
	}
	if ok, _ := k.Restore(ctx, "handbook"); ok {
		t.Fatal("acme's configured kb was restored as a shared one")
	}
	if h, _ := store.Head(ctx, "handbook"); h.Version != 0 {
		t.Fatalf("acme's configured kb leaked into the shared namespace: %+v", h)
	}
}
