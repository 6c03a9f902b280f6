package retrieval_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

func TestVersionScriptHeader(t *testing.T) {
	for _, want := range []string{"KEYS[1]", "KEYS[2]", "ARGV[1]", "Returns"} {
		if !strings.Contains(retrieval.KBVersionLua, want) {
			t.Errorf("kbversion.lua header does not document %s", want)
		}
	}
}

func TestVersionsSync(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	v := retrieval.NewVersions(rdb, prefix(t))
	steps := []struct {
		hash string
		want int64
	}{
		{"aaa", 1}, // first load
		{"aaa", 1}, // same corpus again, e.g. another worker or a restart
		{"bbb", 2}, // changed corpus
		{"bbb", 2},
		{"aaa", 3}, // rolled back: a new number, never a reused one
	}
	for i, s := range steps {
		got, err := v.Sync(ctx, "docs", s.hash)
		if err != nil {
			t.Fatal(err)
		}
		if got != s.want {
			t.Errorf("step %d: Sync(%q) = %d, want %d", i, s.hash, got, s.want)
		}
	}
	if got := rdb.Get(ctx, prefix(t)+"kbhash:{docs}:version").Val(); got != "3" {
		t.Errorf("version key holds %q, want 3", got)
	}
	if got := rdb.Get(ctx, prefix(t)+"kbhash:{docs}:hash").Val(); got != "aaa" {
		t.Errorf("hash key holds %q, want aaa", got)
	}
	if ttl := rdb.TTL(ctx, v.VersionKey("docs")).Val(); ttl != -1 {
		t.Errorf("version key TTL = %v, want none", ttl)
	}
	// Another kb is numbered on its own.
	if got, _ := v.Sync(ctx, "other", "aaa"); got != 1 {
		t.Errorf("second kb starts at %d, want 1", got)
	}
	// A lost version key with the hash still present starts over at 1
	// rather than failing.
	rdb.Del(ctx, v.VersionKey("other"))
	if got, _ := v.Sync(ctx, "other", "aaa"); got != 1 {
		t.Errorf("after losing the version key: %d, want 1", got)
	}
}

func TestVersionsConcurrentLoadersAgree(t *testing.T) {
	ctx := context.Background()
	v := retrieval.NewVersions(testRedis.Client(t), prefix(t))
	const workers = 32
	run := func(hash string) []int64 {
		got := make([]int64, workers)
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() {
				n, err := v.Sync(ctx, "docs", hash)
				if err != nil {
					t.Error(err)
				}
				got[i] = n
			})
		}
		wg.Wait()
		return got
	}
	for round, tc := range []struct {
		hash string
		want int64
	}{{"first", 1}, {"first", 1}, {"second", 2}} {
		for i, n := range run(tc.hash) {
			if n != tc.want {
				t.Fatalf("round %d: worker %d got version %d, want %d", round, i, n, tc.want)
			}
		}
	}
}

func TestNewKBVersioning(t *testing.T) {
	ctx := context.Background()
	opts := retrieval.KBOptions{
		Embedder: embed.NewLocal(embed.LocalOptions{}),
		Versions: retrieval.NewVersions(testRedis.Client(t), prefix(t)),
		Logger:   quiet,
	}
	docs := []retrieval.Document{{ID: "a", Title: "A", Text: "Alpha text."}, {ID: "b", Title: "B", Text: "Beta text."}}
	load := func(docs []retrieval.Document, opts retrieval.KBOptions) *retrieval.KB {
		t.Helper()
		kb, err := retrieval.NewKB(ctx, "docs", docs, opts)
		if err != nil {
			t.Fatal(err)
		}
		return kb
	}
	if v := load(docs, opts).Version(); v != 1 {
		t.Errorf("first load: version %d, want 1", v)
	}
	if v := load([]retrieval.Document{docs[1], docs[0]}, opts).Version(); v != 1 {
		t.Errorf("same documents in another order: version %d, want 1", v)
	}
	changed := []retrieval.Document{docs[0], {ID: "b", Title: "B", Text: "Beta text, edited."}}
	if v := load(changed, opts).Version(); v != 2 {
		t.Errorf("edited document: version %d, want 2", v)
	}
	rechunked := opts
	rechunked.Chunking = retrieval.ChunkOptions{MaxWords: 50}
	if v := load(changed, rechunked).Version(); v != 3 {
		t.Errorf("new chunking: version %d, want 3", v)
	}
	unversioned := opts
	unversioned.Versions = nil
	if v := load(docs, unversioned).Version(); v != 0 {
		t.Errorf("without Versions: version %d, want 0", v)
	}
}
