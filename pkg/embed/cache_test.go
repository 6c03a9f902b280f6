package embed_test

// Tests against a real redis-server live in this external package: the
// testenv helper imports the workflows, which import this package, so an
// internal test importing testenv would be an import cycle.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var testRedis *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { testRedis = r }))
}

// prefix gives each test its own key space on the shared server.
func prefix(t testing.TB) string { return testenv.KeyPrefix(t) }

// countingEmbedder counts Embed calls and can hold them until released.
type countingEmbedder struct {
	inner embed.Embedder
	calls atomic.Int64
	gate  chan struct{} // if not nil, Embed waits for it to close
}

func (c *countingEmbedder) Model() string { return c.inner.Model() }

func (c *countingEmbedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	c.calls.Add(1)
	if c.gate != nil {
		select {
		case <-c.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return c.inner.Embed(ctx, texts)
}

func embedOne(t testing.TB, e embed.Embedder, text string) []float32 {
	t.Helper()
	vecs, err := e.Embed(context.Background(), []string{text})
	if err != nil {
		t.Fatal(err)
	}
	return vecs[0]
}

func TestCacheTiers(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	emb := &countingEmbedder{inner: embed.NewLocal(embed.LocalOptions{})}
	opts := embed.CacheOptions{Prefix: prefix(t), TTL: time.Hour}
	c := embed.NewCache(emb, rdb, opts)

	want := embedOne(t, embed.NewLocal(embed.LocalOptions{}), "how does a token bucket refill")
	steps := []struct {
		cache *embed.Cache
		query string
		tier  string
	}{
		{c, "How does a token bucket refill", embed.TierMiss},
		{c, "how does a token bucket refill", embed.TierMemory},
		{c, "  HOW does a\ttoken bucket refill ", embed.TierMemory},
		// A second worker: empty memory, shared Redis.
		{embed.NewCache(emb, rdb, opts), "how does a TOKEN bucket refill", embed.TierRedis},
	}
	for i, s := range steps {
		vec, tier, err := s.cache.Get(ctx, s.query)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if tier != s.tier {
			t.Errorf("step %d: tier %q, want %q", i, tier, s.tier)
		}
		for j := range want {
			if vec[j] != want[j] {
				t.Fatalf("step %d: dimension %d = %v, want %v", i, j, vec[j], want[j])
			}
		}
	}
	if n := emb.calls.Load(); n != 1 {
		t.Errorf("embedder called %d times, want 1", n)
	}
	// Two memory hits of a vector of float32s.
	if got, want := c.Stats(), (embed.CacheStats{MemoryHits: 2, Misses: 1, Bytes: uint64(2 * 4 * len(want))}); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}

	key := c.Key("how does a token bucket refill")
	if !strings.HasPrefix(key, opts.Prefix+"emb:") || len(key) != len(opts.Prefix)+len("emb:")+64 {
		t.Errorf("key %q is not prefix+emb:+hex(sha256)", key)
	}
	raw, err := rdb.Get(ctx, key).Bytes()
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	if len(raw) != 4*256 {
		t.Errorf("stored %d bytes, want %d (256 little-endian float32s)", len(raw), 4*256)
	}
	if ttl := rdb.TTL(ctx, key).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("TTL = %v, want about 1h", ttl)
	}
}

func TestCacheKeyIncludesModel(t *testing.T) {
	rdb := testRedis.Client(t)
	a := embed.NewCache(embed.NewLocal(embed.LocalOptions{Dims: 256}), rdb, embed.CacheOptions{Prefix: prefix(t)})
	b := embed.NewCache(embed.NewLocal(embed.LocalOptions{Dims: 128}), rdb, embed.CacheOptions{Prefix: prefix(t)})
	if a.Key("q") == b.Key("q") {
		t.Fatal("two models share a cache key")
	}
	vec, tier, err := b.Get(context.Background(), "q")
	if err != nil || tier != embed.TierMiss || len(vec) != 128 {
		t.Fatalf("Get = %d dims, %q, %v; want a 128-dim miss", len(vec), tier, err)
	}
}

func TestCacheKeepCase(t *testing.T) {
	c := embed.NewCache(embed.NewLocal(embed.LocalOptions{}), nil, embed.CacheOptions{KeepCase: true})
	if c.Key("Token Bucket") == c.Key("token bucket") {
		t.Error("KeepCase: keys ignore case")
	}
	if c.Key("Token  Bucket ") != c.Key("Token Bucket") {
		t.Error("KeepCase: keys depend on white space")
	}
}

func TestCacheConcurrentMissesComputeOnce(t *testing.T) {
	rdb := testRedis.Client(t)
	emb := &countingEmbedder{inner: embed.NewLocal(embed.LocalOptions{}), gate: make(chan struct{})}
	c := embed.NewCache(emb, rdb, embed.CacheOptions{Prefix: prefix(t)})

	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			if _, _, err := c.Get(context.Background(), "what is weighted fair queuing"); err != nil {
				errs <- err
			}
		})
	}
	// Let the goroutines pile up behind the first one, then release it.
	deadline := time.Now().Add(5 * time.Second)
	for emb.calls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	close(emb.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := emb.calls.Load(); got != 1 {
		t.Errorf("embedder called %d times for %d concurrent identical misses, want 1", got, n)
	}
	s := c.Stats()
	if s.Misses != 1 || s.Misses+s.Shared+s.MemoryHits != n {
		t.Errorf("Stats() = %+v, want 1 miss and the rest shared or memory hits", s)
	}
}

func TestCacheWaiterOutlivesCancelledLeader(t *testing.T) {
	emb := &countingEmbedder{inner: embed.NewLocal(embed.LocalOptions{}), gate: make(chan struct{})}
	c := embed.NewCache(emb, nil, embed.CacheOptions{})
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	leaderDone := make(chan error, 1)
	go func() {
		_, _, err := c.Get(leaderCtx, "q")
		leaderDone <- err
	}()
	for emb.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	waiterDone := make(chan error, 1)
	go func() {
		_, _, err := c.Get(context.Background(), "q")
		waiterDone <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancelLeader()
	if err := <-leaderDone; err == nil {
		t.Fatal("cancelled leader succeeded")
	}
	// The waiter now runs the load itself; let it through.
	close(emb.gate)
	if err := <-waiterDone; err != nil {
		t.Fatalf("waiter failed with the leader's error: %v", err)
	}
}

func TestCacheSurvivesRedisDown(t *testing.T) {
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dead := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer dead.Close()
	c := embed.NewCache(embed.NewLocal(embed.LocalOptions{}), dead, embed.CacheOptions{})
	vec, tier, err := c.Get(context.Background(), "q")
	if err != nil || tier != embed.TierMiss || len(vec) != 256 {
		t.Fatalf("Get with Redis down = %d dims, %q, %v; want a computed vector", len(vec), tier, err)
	}
	if s := c.Stats(); s.RedisErrors != 1 {
		t.Errorf("RedisErrors = %d, want 1 (the read; the write is skipped)", s.RedisErrors)
	}
}

func TestCacheRecomputesCorruptValue(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	c := embed.NewCache(embed.NewLocal(embed.LocalOptions{}), rdb, embed.CacheOptions{Prefix: prefix(t)})
	if err := rdb.Set(ctx, c.Key("q"), "abc", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	_, tier, err := c.Get(ctx, "q")
	if err != nil || tier != embed.TierMiss {
		t.Fatalf("Get over a corrupt value = %q, %v; want a miss", tier, err)
	}
	if raw, _ := rdb.Get(ctx, c.Key("q")).Bytes(); len(raw) != 1024 {
		t.Errorf("corrupt value not overwritten: %d bytes", len(raw))
	}
}

func BenchmarkCacheGetMemory(b *testing.B) {
	c := embed.NewCache(embed.NewLocal(embed.LocalOptions{}), nil, embed.CacheOptions{})
	ctx := context.Background()
	if _, _, err := c.Get(ctx, "how does a token bucket refill"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := c.Get(ctx, "how does a token bucket refill"); err != nil {
			b.Fatal(err)
		}
	}
}
