package retrieval_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Two tenants' kbs of one name are two kbs to the L2 tier too: the same
// question asked of each is answered from each's own documents, never
// from an entry the other filled, and a change to one evicts nothing of
// the other's. (Cache keys and document indexes carry the kb's key.)
func TestL2KeepsTenantsApart(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	store := kbstore.New(rdb, kbstore.Options{Prefix: prefix(t)})
	acme, globex := kbref.Own("acme", "docs").Key(), kbref.Own("globex", "docs").Key()
	vec := []float32{1, 0, 0, 0, 0, 0, 0, 0}
	for kb, text := range map[string]string{acme: "acme quarterly plans are secret", globex: "globex quarterly plans are public"} {
		rev := kbstore.Revision{ID: "plans", Rev: kb[:4], Title: "Plans", Chunks: []string{text}, Vectors: vec, Dims: 8}
		if _, err := store.Put(ctx, kb, testModel, []kbstore.Revision{rev}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: testModel, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := retrieval.NewCachedRetriever(l, rdb, retrieval.CacheOptions{
		Prefix: prefix(t), TTL: time.Minute, Logger: quiet, VersionKey: store.VersionKey, DocIndexKey: store.L2DocKey,
	})
	ask := func(kb string) (string, bool) {
		t.Helper()
		res, hit, err := c.Get(ctx, retrieval.Query{KB: kb, Text: "quarterly plans", Vector: vec, K: 1})
		if err != nil || len(res.Chunks) != 1 {
			t.Fatalf("retrieve from %s: %+v %v", kb, res, err)
		}
		return res.Chunks[0].Text, hit
	}
	if text, hit := ask(acme); hit || text != "acme quarterly plans are secret" {
		t.Fatalf("acme: %q hit=%v", text, hit)
	}
	if _, hit := ask(acme); !hit {
		t.Fatal("acme's repeat missed")
	}
	if text, hit := ask(globex); hit || text != "globex quarterly plans are public" {
		t.Fatalf("globex got %q (hit=%v): another tenant's entry", text, hit)
	}
	if _, _, err := store.Delete(ctx, globex, "plans"); err != nil {
		t.Fatal(err)
	}
	if _, hit := ask(acme); !hit {
		t.Fatal("a delete in globex's kb evicted acme's entry")
	}
}
