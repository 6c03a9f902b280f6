package latency

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

// testClock stands in for Redis's clock: tests move it instead of sleeping.
type testClock struct{ ms atomic.Int64 }

// newTestClock starts at a slot boundary for any slot that divides 10 s.
func newTestClock() *testClock {
	c := &testClock{}
	c.ms.Store(1_700_000_000_000)
	return c
}

func (c *testClock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

var runs atomic.Int64

// keyPrefix is the test's key space, new on each run: with -count=N every
// run shares one redis-server and, on a test clock, the same slots.
func keyPrefix(t testing.TB) string {
	return testenv.KeyPrefix(t) + strconv.FormatInt(runs.Add(1), 10) + ":"
}

func newWindow(t testing.TB, rdb redis.Scripter, clock *testClock, opts Options) *Window {
	t.Helper()
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = keyPrefix(t)
	}
	w, err := New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	if clock != nil {
		w.clock = clock.Now
	}
	return w
}

func flush(t testing.TB, ws ...*Window) {
	t.Helper()
	for _, w := range ws {
		if err := w.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func snapshot(t testing.TB, w *Window, series string, window time.Duration) Stats {
	t.Helper()
	s, err := w.Snapshot(context.Background(), series, window)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// exact is the ⌈q·n⌉-th smallest of sorted, the rank Quantile estimates.
func exact(sorted []time.Duration, q float64) time.Duration {
	return sorted[max(int(math.Ceil(q*float64(len(sorted)))), 1)-1]
}

// checkQuantiles compares s's quantiles with the exact ones of what was
// recorded, within the stated bound.
func checkQuantiles(t *testing.T, s Stats, recorded []time.Duration) {
	t.Helper()
	sorted := slices.Clone(recorded)
	slices.Sort(sorted)
	if s.Count != int64(len(sorted)) {
		t.Fatalf("count %d, recorded %d", s.Count, len(sorted))
	}
	for _, c := range []struct {
		name string
		q    float64
		got  time.Duration
	}{{"P50", 0.5, s.P50}, {"P90", 0.9, s.P90}, {"P99", 0.99, s.P99}, {"P99.9", 0.999, s.Quantile(0.999)}, {"min", 0, s.Quantile(0)}, {"max", 1, s.Quantile(1)}} {
		want := exact(sorted, c.q)
		if rel := math.Abs(float64(c.got-want)) / float64(want); rel > RelativeError {
			t.Errorf("%s = %v, exact %v: off by %.2f%% > %.0f%%", c.name, c.got, want, rel*100, RelativeError*100)
		}
	}
	var sum time.Duration
	for _, d := range recorded {
		sum += d
	}
	// The sum is kept to the µs per flush, not bucketed.
	if diff := (s.Sum - sum).Abs(); diff > time.Millisecond {
		t.Errorf("sum %v, recorded %v", s.Sum, sum)
	}
}

// Every latency between Min and Max is reported within RelativeError by
// its bucket, and the buckets span exactly that range.
func TestBucketsBoundTheError(t *testing.T) {
	if got := bucketOf(Max); got != numBuckets-1 {
		t.Fatalf("Max falls in bucket %d of %d", got, numBuckets)
	}
	if bucketOf(time.Duration(float64(Max)/gamma)) == numBuckets-1 {
		t.Fatalf("the top bucket is wider than one ratio: numBuckets is too large")
	}
	for x := float64(Min); x <= float64(Max); x *= 1.001 {
		d := time.Duration(x)
		got := bucketValue[bucketOf(d)]
		if rel := math.Abs(float64(got-d)) / float64(d); rel > RelativeError+1e-9 {
			t.Fatalf("%v reported as %v: off by %.3f%%", d, got, rel*100)
		}
	}
	if bucketOf(-time.Second) != 0 || bucketOf(Min) != 0 || bucketOf(24*time.Hour) != numBuckets-1 {
		t.Fatal("out-of-range latencies are not clamped to the end buckets")
	}
}

func TestUniformQuantiles(t *testing.T) {
	rdb := srv.Client(t)
	w := newWindow(t, rdb, newTestClock(), Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	var recorded []time.Duration
	for range 20_000 {
		d := time.Millisecond + time.Duration(rng.Int64N(int64(time.Second)))
		w.Record("llm_total/short", d)
		recorded = append(recorded, d)
	}
	flush(t, w)
	s := snapshot(t, w, "llm_total/short", time.Minute)
	checkQuantiles(t, s, recorded)
	if s.Span < time.Minute || s.Span > time.Minute+10*time.Second {
		t.Errorf("span %v for a 1m window of 10s slots", s.Span)
	}
}

// 80% fast, 20% slow: the tail the healer looks for. P99/P50 is within
// twice the quantile error of the exact ratio.
func TestBimodalTailRatio(t *testing.T) {
	rdb := srv.Client(t)
	w := newWindow(t, rdb, newTestClock(), Options{})
	rng := rand.New(rand.NewPCG(3, 4))
	var recorded []time.Duration
	for i := range 10_000 {
		var d time.Duration
		if i%5 == 4 {
			d = 1500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
		} else {
			d = time.Duration(float64(40*time.Millisecond) + rng.NormFloat64()*float64(5*time.Millisecond))
		}
		w.Record("llm_first_token/long", d)
		recorded = append(recorded, d)
	}
	flush(t, w)
	s := snapshot(t, w, "llm_first_token/long", time.Minute)
	checkQuantiles(t, s, recorded)
	slices.Sort(recorded)
	want := float64(exact(recorded, 0.99)) / float64(exact(recorded, 0.5))
	if got := s.TailRatio(); got < want*(1-RelativeError)/(1+RelativeError) || got > want*(1+RelativeError)/(1-RelativeError) {
		t.Errorf("P99/P50 = %.1f, exact %.1f", got, want)
	}
	if s.TailRatio() < 10 {
		t.Errorf("P99/P50 = %.1f: a 20%% slow mode should read as collapse (> 10)", s.TailRatio())
	}
}

// Two processes recording into one series read back exactly as one
// process that recorded everything.
func TestProcessesMerge(t *testing.T) {
	rdb := srv.Client(t)
	clock := newTestClock()
	prefix := keyPrefix(t)
	a := newWindow(t, rdb, clock, Options{KeyPrefix: prefix})
	b := newWindow(t, rdb, clock, Options{KeyPrefix: prefix})
	alone := newWindow(t, rdb, clock, Options{KeyPrefix: prefix + "alone:"})
	rng := rand.New(rand.NewPCG(5, 6))
	var recorded []time.Duration
	for i := range 6000 {
		// Shifted above Min, below which the error is not bounded.
		d := Min + time.Duration(rng.ExpFloat64()*float64(200*time.Millisecond))
		if i%2 == 0 {
			a.Record("retrieval/short", d)
		} else {
			d *= 10
			b.Record("retrieval/short", d)
		}
		alone.Record("retrieval/short", d)
		recorded = append(recorded, d)
		// Flushes in several slots, interleaved between the processes.
		if i%1000 == 999 {
			flush(t, a, b, alone)
			clock.Advance(7 * time.Second)
		}
	}
	merged := snapshot(t, a, "retrieval/short", time.Minute)
	fromB := snapshot(t, b, "retrieval/short", time.Minute)
	want := snapshot(t, alone, "retrieval/short", time.Minute)
	checkQuantiles(t, merged, recorded)
	if !slices.Equal(merged.hist, want.hist) || !slices.Equal(fromB.hist, want.hist) {
		t.Fatalf("merged histogram differs from one process's:\n%v\n%v", merged.hist, want.hist)
	}
	if merged.P50 != want.P50 || merged.P99 != want.P99 || merged.Count != want.Count {
		t.Fatalf("merged %+v, one process %+v", merged, want)
	}
}

// A window reads the slots that overlap it, and a slot falls out when it no
// longer does; its key expires by itself a retention after it ends.
func TestOldSlotsFallOut(t *testing.T) {
	rdb := srv.Client(t)
	clock := newTestClock()
	w := newWindow(t, rdb, clock, Options{Slot: 10 * time.Second, Retention: 2 * time.Minute})
	const series = "llm_first_token/short"

	clock.Advance(5 * time.Second) // slot k
	for range 100 {
		w.Record(series, 3*time.Second)
	}
	flush(t, w)
	clock.Advance(30 * time.Second) // t0+35s, slot k+3
	for range 100 {
		w.Record(series, 30*time.Millisecond)
	}
	flush(t, w)

	clock.Advance(5 * time.Second) // t0+40s
	s := snapshot(t, w, series, time.Minute)
	if s.Count != 200 || s.Span != 60*time.Second {
		t.Fatalf("at t0+40s, 1m window: count %d span %v, want 200 over 60s (slots from t0-20s)", s.Count, s.Span)
	}
	if s := snapshot(t, w, series, 10*time.Second); s.Count != 100 || s.P99 > 35*time.Millisecond {
		t.Fatalf("at t0+40s, 10s window: count %d P99 %v, want only the fast 100", s.Count, s.P99)
	}

	clock.Advance(35 * time.Second) // t0+75s: the window starts in slot k+1
	s = snapshot(t, w, series, time.Minute)
	if s.Count != 100 || s.P50 > 35*time.Millisecond || s.Span != 65*time.Second {
		t.Fatalf("at t0+75s: count %d P50 %v span %v, want the fast 100 over 65s", s.Count, s.P50, s.Span)
	}

	// The first slot's key lives until its end (t0+10s) plus retention:
	// written at t0+5s, a TTL of 2m5s.
	keys, err := rdb.Keys(context.Background(), w.prefix+"*").Result()
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	slices.Sort(keys)
	ttl := rdb.PTTL(context.Background(), keys[0]).Val()
	if ttl > 2*time.Minute+5*time.Second || ttl < 2*time.Minute {
		t.Fatalf("first slot's TTL %v, want 2m5s", ttl)
	}
}

// Counters are windowed like latencies; a timeout rate is two of them read
// over the same slots in one call.
func TestCounters(t *testing.T) {
	rdb := srv.Client(t)
	clock := newTestClock()
	prefix := keyPrefix(t)
	a := newWindow(t, rdb, clock, Options{KeyPrefix: prefix})
	b := newWindow(t, rdb, clock, Options{KeyPrefix: prefix})
	requests, timeouts := Series("llm_requests", "long"), Series("llm_timeout", "long")

	for i := range 400 {
		w := []*Window{a, b}[i%2]
		w.Add(requests, 1)
		if i%8 == 0 {
			w.Add(timeouts, 1)
		}
	}
	flush(t, a, b)
	clock.Advance(30 * time.Second)
	a.Add(requests, 100)
	flush(t, a)

	s, err := b.Snapshots(context.Background(), time.Minute, requests, timeouts, "never_written/long")
	if err != nil {
		t.Fatal(err)
	}
	if s[0].Added != 500 || s[1].Added != 50 || s[2].Added != 0 {
		t.Fatalf("added %d %d %d, want 500 50 0", s[0].Added, s[1].Added, s[2].Added)
	}
	if rate := float64(s[1].Added) / float64(s[0].Added); rate != 0.1 {
		t.Fatalf("timeout rate %v", rate)
	}
	if s[0].Count != 0 || s[0].P99 != 0 || s[0].TailRatio() != 0 || s[0].Mean() != 0 {
		t.Fatalf("a counter has latencies: %+v", s[0])
	}
	clock.Advance(40 * time.Second) // the first slot is out of the minute
	if s := snapshot(t, b, requests, time.Minute); s.Added != 100 {
		t.Fatalf("added %d after the first slot left the window, want 100", s.Added)
	}
}

// Records from many goroutines, racing flushes, all arrive exactly once.
func TestConcurrentRecord(t *testing.T) {
	rdb := srv.Client(t)
	w := newWindow(t, rdb, newTestClock(), Options{})
	const goroutines, each = 4, 20_000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				w.Record("embed/short", time.Duration(g*each+i)*time.Microsecond)
				w.Add("embed_requests/short", 1)
			}
		})
	}
	done := make(chan struct{})
	flushed := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				flushed <- n
				return
			default:
				if err := w.Flush(context.Background()); err != nil {
					t.Error(err)
				}
				n++
			}
		}
	}()
	wg.Wait()
	close(done)
	n := <-flushed
	flush(t, w)
	s, err := w.Snapshots(context.Background(), time.Minute, "embed/short", "embed_requests/short")
	if err != nil {
		t.Fatal(err)
	}
	if s[0].Count != goroutines*each || s[1].Added != goroutines*each {
		t.Fatalf("after %d racing flushes: %d latencies and %d added, want %d", n, s[0].Count, s[1].Added, goroutines*each)
	}
	t.Logf("%d flushes raced the records", n)
}

// failing is a Redis that refuses scripts while down is set.
type failing struct {
	redis.Scripter
	down atomic.Bool
}

func (f *failing) fail(ctx context.Context) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(errors.New("connection refused"))
	return cmd
}

func (f *failing) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if f.down.Load() {
		return f.fail(ctx)
	}
	return f.Scripter.EvalSha(ctx, sha, keys, args...)
}

func (f *failing) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if f.down.Load() {
		return f.fail(ctx)
	}
	return f.Scripter.Eval(ctx, script, keys, args...)
}

// A failed flush keeps its counts for the next one, for up to one slot.
func TestFailedFlushKeepsCounts(t *testing.T) {
	rdb := &failing{Scripter: srv.Client(t)}
	clock := newTestClock()
	w := newWindow(t, rdb, clock, Options{})
	ctx := context.Background()

	rdb.down.Store(true)
	w.Record("rerank/short", 10*time.Millisecond)
	w.Add("rerank_requests/short", 1)
	if err := w.Flush(ctx); err == nil || errors.Is(err, ErrDropped) {
		t.Fatalf("flush with redis down: %v", err)
	}
	clock.Advance(5 * time.Second)
	w.Record("rerank/short", 20*time.Millisecond)
	if err := w.Flush(ctx); err == nil || errors.Is(err, ErrDropped) {
		t.Fatalf("second flush with redis down: %v", err)
	}
	rdb.down.Store(false)
	flush(t, w)
	s, err := w.Snapshots(ctx, time.Minute, "rerank/short", "rerank_requests/short")
	if err != nil {
		t.Fatal(err)
	}
	if s[0].Count != 2 || s[0].Sum != 30*time.Millisecond || s[1].Added != 1 {
		t.Fatalf("after recovery: %d latencies summing %v, %d added; want 2, 30ms, 1", s[0].Count, s[0].Sum, s[1].Added)
	}

	// Down for longer than a slot: the counts are dropped, not written
	// into a slot they do not belong to.
	rdb.down.Store(true)
	w.Record("rerank/short", 10*time.Millisecond)
	if err := w.Flush(ctx); err == nil {
		t.Fatal("flush with redis down succeeded")
	}
	clock.Advance(11 * time.Second)
	err = w.Flush(ctx)
	if !errors.Is(err, ErrDropped) || !strings.Contains(err.Error(), "1 latencies") {
		t.Fatalf("flush after a slot of failures: %v", err)
	}
	rdb.down.Store(false)
	flush(t, w)
	if s := snapshot(t, w, "rerank/short", time.Minute); s.Count != 2 {
		t.Fatalf("count %d, want the 2 from before: the dropped one came back", s.Count)
	}
}

// Run flushes on its ticker, logs a failed flush, and flushes what is left
// when its context ends.
func TestRun(t *testing.T) {
	rdb := &failing{Scripter: srv.Client(t)}
	var logs testenv.SyncBuffer
	w := newWindow(t, rdb, nil, Options{
		FlushEvery: 10 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- w.Run(ctx) }()

	w.Record("queue_wait/short", time.Second)
	waitFor(t, "a flush by the ticker", func() bool { return snapshot(t, w, "queue_wait/short", time.Minute).Count == 1 })

	rdb.down.Store(true)
	w.Record("queue_wait/short", time.Second)
	waitFor(t, "a failed flush logged", func() bool { return strings.Contains(logs.String(), "connection refused") })
	rdb.down.Store(false)

	// Not yet flushed when ctx ends, whatever the ticker did: Run's last
	// flush sends it.
	w.flushing.Lock()
	cancel()
	w.Record("queue_wait/short", time.Second)
	w.flushing.Unlock()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if s := snapshot(t, w, "queue_wait/short", time.Minute); s.Count != 3 {
		t.Fatalf("count %d after Run returned, want 3", s.Count)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10s", what)
		}
	}
}

func TestOptionsAndWindowChecked(t *testing.T) {
	rdb := srv.Client(t)
	for _, opts := range []Options{
		{Slot: time.Microsecond},
		{Slot: time.Minute, Retention: time.Second},
		{Slot: time.Second, FlushEvery: 2 * time.Second},
		{FlushEvery: -time.Second},
	} {
		if _, err := New(rdb, opts); err == nil {
			t.Errorf("New accepted %+v", opts)
		}
	}
	if w, err := New(rdb, Options{Slot: 100 * time.Millisecond}); err != nil || w.flushEvery != 100*time.Millisecond {
		t.Errorf("a slot shorter than the default flush interval: %v", err)
	}
	w := newWindow(t, rdb, nil, Options{Retention: time.Minute})
	for _, window := range []time.Duration{0, -time.Second, 2 * time.Minute} {
		if _, err := w.Snapshot(context.Background(), "x", window); err == nil {
			t.Errorf("Snapshot accepted a window of %v with 1m retention", window)
		}
	}
	s := snapshot(t, w, "never_written", time.Minute)
	if s.Count != 0 || s.P50 != 0 || s.Quantile(0.5) != 0 || s.Added != 0 {
		t.Fatalf("an empty series reads %+v", s)
	}
}
