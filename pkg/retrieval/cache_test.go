package retrieval_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// countingRetriever counts pins and retrievals and lets a test change the
// version it answers from, as a reload with new content would.
type countingRetriever struct {
	inner   *retrieval.Hybrid
	version atomic.Int64
	pins    atomic.Int64
	calls   atomic.Int64
	// afterPin, if set, runs after each pin, as a change of the kb would.
	afterPin func()
}

func (c *countingRetriever) Pin(ctx context.Context, kb string) (retrieval.Pinned, error) {
	p, err := c.inner.Pin(ctx, kb)
	if err != nil {
		return nil, err
	}
	c.pins.Add(1)
	pinned := countingPinned{c: c, inner: p, version: c.version.Load()}
	if c.afterPin != nil {
		c.afterPin()
	}
	return pinned, nil
}

func (c *countingRetriever) Retrieve(ctx context.Context, q retrieval.Query) (retrieval.Result, error) {
	p, err := c.Pin(ctx, q.KB)
	if err != nil {
		return retrieval.Result{}, err
	}
	return p.Retrieve(ctx, q)
}

type countingPinned struct {
	c       *countingRetriever
	inner   retrieval.Pinned
	version int64
}

func (p countingPinned) Version() int64 { return p.version }

func (p countingPinned) Retrieve(ctx context.Context, q retrieval.Query) (retrieval.Result, error) {
	p.c.calls.Add(1)
	res, err := p.inner.Retrieve(ctx, q)
	res.KBVersion = p.version
	return res, err
}

func newCounting(t *testing.T, version int64) *countingRetriever {
	c := &countingRetriever{inner: newHybrid(t, retrieval.HybridOptions{}, mustBuiltin(t))}
	c.version.Store(version)
	return c
}

func TestCachedRetrieverHitMissAndVersion(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	inner := newCounting(t, 1)
	c := retrieval.NewCachedRetriever(inner, rdb, retrieval.CacheOptions{Prefix: prefix(t), TTL: 10 * time.Minute, Version: "local-hash-v1/256", Logger: quiet})
	q := retrieval.Query{KB: "sluice-docs", Text: "How does a token bucket refill?", Vector: queryVector(t, "how does a token bucket refill?"), K: 3}

	first, hit, err := c.Get(ctx, q)
	if err != nil || hit {
		t.Fatalf("first Get: hit=%v err=%v, want a miss", hit, err)
	}
	// Same question, other spelling: same key.
	q2 := q
	q2.Text = "  how does a TOKEN bucket refill?"
	second, hit, err := c.Get(ctx, q2)
	if err != nil || !hit {
		t.Fatalf("second Get: hit=%v err=%v, want a hit", hit, err)
	}
	if fmt.Sprint(first) != fmt.Sprint(second) {
		t.Errorf("cached result differs:\n%v\n%v", first, second)
	}
	if n := inner.calls.Load(); n != 1 {
		t.Errorf("inner retriever called %d times, want 1", n)
	}

	key := c.Key(q, 1)
	wantPrefix := prefix(t) + "ret:{sluice-docs}:v1:k3:"
	if !strings.HasPrefix(key, wantPrefix) || !strings.HasSuffix(key, ":local-hash-v1/256") || len(key) != len(wantPrefix)+64+len(":local-hash-v1/256") {
		t.Errorf("key = %q, want %s<sha256 hex>:local-hash-v1/256", key, wantPrefix)
	}
	var stored retrieval.Result
	if err := json.Unmarshal([]byte(rdb.Get(ctx, key).Val()), &stored); err != nil || stored.KBVersion != 1 || len(stored.Chunks) != 3 {
		t.Errorf("stored value: %+v, %v", stored, err)
	}
	if ttl := rdb.TTL(ctx, key).Val(); ttl <= 9*time.Minute || ttl > 10*time.Minute {
		t.Errorf("TTL = %v, want about 10m", ttl)
	}

	// Another K is another entry.
	q3 := q
	q3.K = 5
	if _, hit, _ := c.Get(ctx, q3); hit {
		t.Error("K=5 hit the K=3 entry")
	}

	// The kb is reloaded with new content: version 2. The old entry is
	// still in Redis but no longer reachable.
	inner.version.Store(2)
	res, hit, err := c.Get(ctx, q)
	if err != nil || hit || res.KBVersion != 2 {
		t.Fatalf("after version bump: hit=%v version=%d err=%v, want a v2 miss", hit, res.KBVersion, err)
	}
	if rdb.Exists(ctx, key).Val() != 1 {
		t.Error("old entry was deleted; it should just be unreachable")
	}
	if _, hit, _ := c.Get(ctx, q); !hit {
		t.Error("v2 entry not cached")
	}
	if got := c.Stats(); got.Bytes == 0 {
		t.Errorf("Stats().Bytes = %d, want the two hits' bytes", got.Bytes)
	}
	if got, want := c.Stats(), (retrieval.CacheStats{Hits: 2, Misses: 3, Bytes: c.Stats().Bytes}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

// A kb that changes between the pin and the search does not matter: the
// miss searches the pinned version and caches it under that version's key.
func TestCachedRetrieverSearchesThePinnedVersion(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	inner := newCounting(t, 1)
	inner.afterPin = func() { inner.version.Add(1) }
	c := retrieval.NewCachedRetriever(inner, rdb, retrieval.CacheOptions{Prefix: prefix(t), Logger: quiet})
	q := retrieval.Query{KB: "sluice-docs", Text: "redis streams", K: 2}
	res, hit, err := c.Get(ctx, q)
	if err != nil || hit || res.KBVersion != 1 {
		t.Fatalf("Get: version %d, hit=%v, err=%v; want a v1 miss", res.KBVersion, hit, err)
	}
	if pins, calls := inner.pins.Load(), inner.calls.Load(); pins != 1 || calls != 1 {
		t.Errorf("%d pins and %d searches for one miss, want 1 and 1", pins, calls)
	}
	var stored retrieval.Result
	if err := json.Unmarshal([]byte(rdb.Get(ctx, c.Key(q, 1)).Val()), &stored); err != nil || stored.KBVersion != 1 {
		t.Errorf("v1 entry: %+v, %v", stored, err)
	}
}

func TestCachedRetrieverVersionOptionSeparatesEntries(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	inner := newCounting(t, 1)
	q := retrieval.Query{KB: "sluice-docs", Text: "redis streams", K: 2}
	a := retrieval.NewCachedRetriever(inner, rdb, retrieval.CacheOptions{Prefix: prefix(t), Version: "emb-a", Logger: quiet})
	b := retrieval.NewCachedRetriever(inner, rdb, retrieval.CacheOptions{Prefix: prefix(t), Version: "emb-b", Logger: quiet})
	if _, hit, _ := a.Get(ctx, q); hit {
		t.Fatal("first Get hit")
	}
	if _, hit, _ := b.Get(ctx, q); hit {
		t.Error("another Version option hit the same entry")
	}
	if ttl := rdb.TTL(ctx, a.Key(q, 1)).Val(); ttl <= 59*time.Minute {
		t.Errorf("default TTL = %v, want 1h", ttl)
	}
}

// RefsOnly entries keep each chunk's ID, document and score, not its
// text: a hit returns the same ranking without Title and Text, from a
// smaller entry under a key of its own.
func TestCachedRetrieverRefsOnly(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	inner := newCounting(t, 1)
	q := retrieval.Query{KB: "sluice-docs", Text: "how does a token bucket refill", K: 5}
	full := retrieval.NewCachedRetriever(inner, rdb, retrieval.CacheOptions{Prefix: prefix(t), Version: "emb", Logger: quiet})
	refs := retrieval.NewCachedRetriever(inner, rdb, retrieval.CacheOptions{Prefix: prefix(t), Version: "emb", RefsOnly: true, Logger: quiet})
	miss, hit, err := refs.Get(ctx, q)
	if err != nil || hit || len(miss.Chunks) == 0 || miss.Chunks[0].Text == "" {
		t.Fatalf("first Get: hit %v, err %v, %+v", hit, err, miss)
	}
	got, hit, err := refs.Get(ctx, q)
	if err != nil || !hit {
		t.Fatalf("second Get: hit %v, err %v", hit, err)
	}
	if got.KB != miss.KB || got.KBVersion != miss.KBVersion || len(got.Chunks) != len(miss.Chunks) {
		t.Fatalf("hit %+v, miss %+v", got, miss)
	}
	for i, ch := range got.Chunks {
		m := miss.Chunks[i]
		if ch.ID != m.ID || ch.DocID != m.DocID || ch.Score != m.Score || ch.Text != "" || ch.Title != "" {
			t.Fatalf("chunk %d: hit %+v, miss %+v", i, ch, m)
		}
	}
	if _, hit, _ := full.Get(ctx, q); hit {
		t.Fatal("a full-entry cache read a refs-only entry")
	}
	refsLen := rdb.StrLen(ctx, refs.Key(q, 1)).Val()
	fullLen := rdb.StrLen(ctx, full.Key(q, 1)).Val()
	t.Logf("entry bytes: refs-only %d, full %d", refsLen, fullLen)
	if refsLen == 0 || refsLen*3 > fullLen {
		t.Fatalf("refs-only entry %d bytes, full entry %d: want under a third", refsLen, fullLen)
	}
}

func TestCachedRetrieverBypassesUnversionedKB(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	inner := newCounting(t, 0)
	c := retrieval.NewCachedRetriever(inner, rdb, retrieval.CacheOptions{Prefix: prefix(t), Logger: quiet})
	q := retrieval.Query{KB: "sluice-docs", Text: "redis streams", K: 2}
	for range 2 {
		if _, hit, err := c.Get(ctx, q); err != nil || hit {
			t.Fatalf("unversioned kb: hit=%v err=%v", hit, err)
		}
	}
	if inner.calls.Load() != 2 || c.Stats().Bypassed != 2 {
		t.Errorf("calls=%d stats=%+v, want 2 bypassed retrievals", inner.calls.Load(), c.Stats())
	}
	if n := rdb.Keys(ctx, prefix(t)+"*").Val(); len(n) != 0 {
		t.Errorf("wrote %v for an unversioned kb", n)
	}
}

func TestCachedRetrieverUnknownKB(t *testing.T) {
	c := retrieval.NewCachedRetriever(newCounting(t, 1), testRedis.Client(t), retrieval.CacheOptions{Prefix: prefix(t), Logger: quiet})
	_, _, err := c.Get(context.Background(), retrieval.Query{KB: "nope", Text: "x", K: 1})
	if !errors.Is(err, retrieval.ErrUnknownKB) {
		t.Errorf("err = %v, want ErrUnknownKB", err)
	}
}

func TestCachedRetrieverSurvivesRedisDown(t *testing.T) {
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dead := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer dead.Close()
	c := retrieval.NewCachedRetriever(newCounting(t, 1), dead, retrieval.CacheOptions{Logger: quiet})
	res, hit, err := c.Get(context.Background(), retrieval.Query{KB: "sluice-docs", Text: "redis streams", K: 2})
	if err != nil || hit || len(res.Chunks) != 2 {
		t.Fatalf("Redis down: %d chunks, hit=%v, err=%v; want a retrieved result", len(res.Chunks), hit, err)
	}
	if s := c.Stats(); s.RedisErrors != 1 {
		t.Errorf("RedisErrors = %d, want 1 (the read; the write is skipped)", s.RedisErrors)
	}
}

func TestCachedRetrieverReplacesBadValue(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	c := retrieval.NewCachedRetriever(newCounting(t, 1), rdb, retrieval.CacheOptions{Prefix: prefix(t), Logger: quiet})
	q := retrieval.Query{KB: "sluice-docs", Text: "redis streams", K: 2}
	for _, bad := range []string{"{not json", `{"kb":"other","kb_version":1,"chunks":[]}`} {
		rdb.Set(ctx, c.Key(q, 1), bad, time.Hour)
		if _, hit, err := c.Get(ctx, q); err != nil || hit {
			t.Errorf("value %q: hit=%v err=%v, want a miss", bad, hit, err)
		}
		if _, hit, _ := c.Get(ctx, q); !hit {
			t.Errorf("value %q was not replaced", bad)
		}
	}
}

// A CachedRetriever over a Live kb whose documents are ingested: a
// changed document makes a new version, and the cache misses.
func TestCachedRetrieverOverChangedKB(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	store := kbstore.New(rdb, kbstore.Options{Prefix: prefix(t)})
	ing := &ingest.Ingester{Store: store, Embedder: mustBuiltinEmbedder()}
	builtin, err := retrieval.Builtin("sluice-docs")
	if err != nil {
		t.Fatal(err)
	}
	docs := make([]ingest.Document, len(builtin))
	for i, d := range builtin {
		docs[i] = ingest.Document{ID: d.ID, Title: d.Title, Text: d.Text}
	}
	v1, err := ing.Put(ctx, "sluice-docs", docs)
	if err != nil {
		t.Fatal(err)
	}
	live, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: mustBuiltinEmbedder().Model(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := retrieval.NewCachedRetriever(live, rdb, retrieval.CacheOptions{Prefix: prefix(t), Logger: quiet})
	q := retrieval.Query{KB: "sluice-docs", Text: "token bucket", K: 3}
	c.Get(ctx, q)
	if res, hit, _ := c.Get(ctx, q); !hit || res.KBVersion != v1.Version {
		t.Fatalf("v%d not cached: hit=%v version=%d", v1.Version, hit, res.KBVersion)
	}

	docs[0].Text += "\n\nAn added paragraph."
	v2, err := ing.Put(ctx, "sluice-docs", docs[:1])
	if err != nil {
		t.Fatal(err)
	}
	if v2.Version != v1.Version+1 {
		t.Fatalf("versions %d then %d", v1.Version, v2.Version)
	}
	if res, hit, _ := c.Get(ctx, q); hit || res.KBVersion != v2.Version {
		t.Errorf("after the change: hit=%v version=%d", hit, res.KBVersion)
	}
}

func BenchmarkCachedRetrieverHit(b *testing.B) {
	ctx := context.Background()
	rdb := testRedis.Client(b)
	inner := &countingRetriever{inner: newHybrid(b, retrieval.HybridOptions{}, mustBuiltin(b))}
	inner.version.Store(1)
	c := retrieval.NewCachedRetriever(inner, rdb, retrieval.CacheOptions{Prefix: prefix(b), Logger: quiet})
	q := retrieval.Query{KB: "sluice-docs", Text: "how does a token bucket refill", K: 10}
	if _, _, err := c.Get(ctx, q); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, hit, err := c.Get(ctx, q); err != nil || !hit {
			b.Fatal(hit, err)
		}
	}
}
