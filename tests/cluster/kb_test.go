package cluster

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

func revision(id, rev, text string) kbstore.Revision {
	return kbstore.Revision{ID: id, Rev: rev, Title: id, Chunks: []string{text}, Vectors: []float32{1, 0, 0, 1}, Dims: 4}
}

// A tenant's kb through the store's put, delete and changes scripts and
// its pipelines, with the retrieval cache in front of it: an entry
// written on a miss, read back by the one-trip l2get script, and dropped
// by the put that replaces its document.
func TestKnowledgeBase(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	store := kbstore.New(rdb, kbstore.Options{Prefix: prefix})
	kb := kbref.Own("acme", "docs").Key()
	res, err := store.Put(ctx, kb, "m", []kbstore.Revision{
		revision("a", "a1", "token buckets refill continuously"),
		revision("b", "b1", "leases come back when a holder dies"),
	})
	ok(t, "put", err)
	if res.Version != 1 {
		t.Fatalf("put: %+v, want version 1", res)
	}
	names, err := store.KBs(ctx, "acme")
	ok(t, "list kbs", err)
	if len(names) != 1 || names[0] != "docs" {
		t.Fatalf("acme's kbs %v, want [docs]", names)
	}

	live, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: "m", Logger: logger(t)})
	ok(t, "new live retriever", err)
	cache := retrieval.NewCachedRetriever(live, rdb, retrieval.CacheOptions{Prefix: prefix, Logger: logger(t),
		Version: "test", DocIndexKey: store.L2DocKey, VersionKey: store.VersionKey})
	q := retrieval.Query{KB: kb, Text: "token buckets", Vector: []float32{1, 0, 0, 1}, K: 2}
	if _, hit, err := cache.Get(ctx, q); err != nil || hit {
		t.Fatalf("first get: hit %v, %v", hit, err)
	}
	if _, hit, err := cache.Get(ctx, q); err != nil || !hit {
		t.Fatalf("second get: hit %v, %v; want a hit read by l2get", hit, err)
	}
	if st := cache.Stats(); st.RedisErrors != 0 {
		t.Fatalf("cache stats %+v: redis errors (see the log)", st)
	}
	res, err = store.Put(ctx, kb, "m", []kbstore.Revision{revision("a", "a2", "token buckets refill, continuously")})
	ok(t, "put a new revision", err)
	if res.Version != 2 {
		t.Fatalf("second put: %+v", res)
	}
	if n, err := rdb.Exists(ctx, cache.Key(q, 1)).Result(); err != nil || n != 0 {
		t.Fatalf("the cached entry of the replaced document is still there (%v)", err)
	}
	_, deleted, err := store.Delete(ctx, kb, "b")
	ok(t, "delete", err)
	if !deleted {
		t.Fatal("b was not deleted")
	}
	head, changes, err := store.Changes(ctx, kb, 1)
	ok(t, "changes", err)
	if head.Version != 3 || len(changes) != 2 {
		t.Fatalf("changes since 1: %+v %+v", head, changes)
	}
	revs, err := store.Load(ctx, kb, []kbstore.Change{{ID: "a", Rev: "a2"}})
	ok(t, "load", err)
	if len(revs) != 1 {
		t.Fatalf("loaded %+v", revs)
	}
	_, err = store.Head(ctx, kb)
	ok(t, "head", err)
	_, err = store.Info(ctx, kb, kbstore.Page{Limit: 10})
	ok(t, "info", err)
	_, err = store.Usage(ctx, kb)
	ok(t, "usage", err)
	_, err = store.Revs(ctx, kb, []string{"a", "b"})
	ok(t, "revs", err)
}
