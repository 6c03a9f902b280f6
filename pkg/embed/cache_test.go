package embed

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

	"github.com/sluice-dev/sluice/tests/testenv"
)

var testRedis *testenv.Redis

func TestMain(m *testing.M) {
	r, err := testenv.LaunchRedis()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testRedis = r
	code := m.Run()
	r.Stop()
	os.Exit(code)
}

// prefix gives each test its own key space on the shared server.
func prefix(t testing.TB) string {
	return "test:" + strings.ReplaceAll(t.Name(), "/", ":") + ":"
}

// countingEmbedder counts Embed calls and can hold them until released.
type countingEmbedder struct {
	inner Embedder
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

func TestCacheTiers(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	emb := &countingEmbedder{inner: NewLocal(LocalOptions{})}
	opts := CacheOptions{Prefix: prefix(t), TTL: time.Hour}
	c := NewCache(emb, rdb, opts)

	want := embedOne(t, NewLocal(LocalOptions{}), "how does a token bucket refill")
	steps := []struct {
		cache *Cache
		query string
		tier  string
	}{
		{c, "How does a token bucket refill", TierMiss},
		{c, "how does a token bucket refill", TierMemory},
		{c, "  HOW does a\ttoken bucket refill ", TierMemory},
		// A second worker: empty memory, shared Redis.
		{NewCache(emb, rdb, opts), "how does a TOKEN bucket refill", TierRedis},
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
	if got, want := c.Stats(), (CacheStats{MemoryHits: 2, Misses: 1}); got != want {
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
	a := NewCache(NewLocal(LocalOptions{Dims: 256}), rdb, CacheOptions{Prefix: prefix(t)})
	b := NewCache(NewLocal(LocalOptions{Dims: 128}), rdb, CacheOptions{Prefix: prefix(t)})
	if a.Key("q") == b.Key("q") {
		t.Fatal("two models share a cache key")
	}
	vec, tier, err := b.Get(context.Background(), "q")
	if err != nil || tier != TierMiss || len(vec) != 128 {
		t.Fatalf("Get = %d dims, %q, %v; want a 128-dim miss", len(vec), tier, err)
	}
}

func TestCacheKeepCase(t *testing.T) {
	c := NewCache(NewLocal(LocalOptions{}), nil, CacheOptions{KeepCase: true})
	if c.Key("Token Bucket") == c.Key("token bucket") {
		t.Error("KeepCase: keys ignore case")
	}
	if c.Key("Token  Bucket ") != c.Key("Token Bucket") {
		t.Error("KeepCase: keys depend on white space")
	}
}

func TestCacheConcurrentMissesComputeOnce(t *testing.T) {
	rdb := testRedis.Client(t)
	emb := &countingEmbedder{inner: NewLocal(LocalOptions{}), gate: make(chan struct{})}
	c := NewCache(emb, rdb, CacheOptions{Prefix: prefix(t)})

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
	emb := &countingEmbedder{inner: NewLocal(LocalOptions{}), gate: make(chan struct{})}
	c := NewCache(emb, nil, CacheOptions{})
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
	c := NewCache(NewLocal(LocalOptions{}), dead, CacheOptions{})
	vec, tier, err := c.Get(context.Background(), "q")
	if err != nil || tier != TierMiss || len(vec) != 256 {
		t.Fatalf("Get with Redis down = %d dims, %q, %v; want a computed vector", len(vec), tier, err)
	}
	if s := c.Stats(); s.RedisErrors != 1 {
		t.Errorf("RedisErrors = %d, want 1 (the read; the write is skipped)", s.RedisErrors)
	}
}

func TestCacheRecomputesCorruptValue(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis.Client(t)
	c := NewCache(NewLocal(LocalOptions{}), rdb, CacheOptions{Prefix: prefix(t)})
	if err := rdb.Set(ctx, c.Key("q"), "abc", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	_, tier, err := c.Get(ctx, "q")
	if err != nil || tier != TierMiss {
		t.Fatalf("Get over a corrupt value = %q, %v; want a miss", tier, err)
	}
	if raw, _ := rdb.Get(ctx, c.Key("q")).Bytes(); len(raw) != 1024 {
		t.Errorf("corrupt value not overwritten: %d bytes", len(raw))
	}
}

func TestLRUEvictsLeastRecentlyUsed(t *testing.T) {
	c := newLRU(2)
	k := func(b byte) [32]byte { return [32]byte{b} }
	c.put(k(1), []float32{1})
	c.put(k(2), []float32{2})
	c.get(k(1)) // 2 is now the least recent
	c.put(k(3), []float32{3})
	if _, ok := c.get(k(2)); ok {
		t.Error("least recently used entry survived")
	}
	for _, b := range []byte{1, 3} {
		if v, ok := c.get(k(b)); !ok || v[0] != float32(b) {
			t.Errorf("entry %d = %v, %v", b, v, ok)
		}
	}
	c.put(k(3), []float32{33})
	if v, _ := c.get(k(3)); v[0] != 33 || c.len() != 2 {
		t.Errorf("update: %v, len %d", v, c.len())
	}
}

func BenchmarkCacheGetMemory(b *testing.B) {
	c := NewCache(NewLocal(LocalOptions{}), nil, CacheOptions{})
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
