package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
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

func newLimiter(t *testing.T) (*Limiter, *redis.Client) {
	t.Helper()
	rdb := srv.Client(t)
	return New(rdb, Options{KeyPrefix: testenv.KeyPrefix(t), ReservationTTL: time.Minute}), rdb
}

func level(t *testing.T, rdb *redis.Client, l *Limiter, b Bucket) float64 {
	t.Helper()
	v, err := rdb.Get(context.Background(), l.bucketKey(b)).Result()
	if err == redis.Nil {
		return b.Capacity
	}
	if err != nil {
		t.Fatal(err)
	}
	f, ok := StoredLevel(v)
	if !ok {
		t.Fatalf("bucket state %q: want three doubles", v)
	}
	return f
}

func tok(id string, capacity, perSec, cost float64) Bucket {
	return Bucket{Dimension: "tenant", ID: id, Kind: Tokens, Capacity: capacity, PerSecond: perSec, Cost: cost}
}

func TestReserveChargesEveryBucket(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	bs := []Bucket{tok("acme", 1000, 1, 300), {Dimension: "user", ID: "alice", Kind: Requests, Capacity: 10, PerSecond: 1, Cost: 1}}
	d, err := l.Reserve(ctx, "r1", bs)
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != Allowed || d.Bucket != nil {
		t.Fatalf("decision %+v", d)
	}
	if math.Abs(d.Remaining[0]-700) > 1 || math.Abs(d.Remaining[1]-9) > 0.01 {
		t.Fatalf("remaining %v, want ~[700 9]", d.Remaining)
	}
	if d.ResetAfter[0] < 299*time.Second || d.ResetAfter[0] > 301*time.Second {
		t.Fatalf("reset after %v, want ~300s", d.ResetAfter[0])
	}
	if got := level(t, rdb, l, bs[0]); math.Abs(got-700) > 1 {
		t.Fatalf("stored level %v, want ~700", got)
	}
}

// No partial charge: when one dimension refuses, no bucket is touched.
func TestRefusalChargesNothing(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	tenant := tok("acme", 1000, 1, 100)
	user := Bucket{Dimension: "user", ID: "bob", Kind: Tokens, Capacity: 150, PerSecond: 0.001, Cost: 100}
	if d, _ := l.Reserve(ctx, "a", []Bucket{tenant, user}); d.Status != Allowed {
		t.Fatalf("first: %+v", d)
	}
	d, err := l.Reserve(ctx, "b", []Bucket{tenant, user})
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != Limited || d.Bucket == nil || d.Bucket.Dimension != "user" {
		t.Fatalf("decision %+v, want limited by user", d)
	}
	// 100 more tokens at 0.001/s: ~50,000 s.
	if d.RetryAfter < 40000*time.Second {
		t.Fatalf("retry after %v", d.RetryAfter)
	}
	if got := level(t, rdb, l, tenant); math.Abs(got-900) > 1 {
		t.Fatalf("tenant level %v after a refusal, want ~900 (uncharged)", got)
	}
	if d.Reservation != "" {
		t.Fatal("a refused request has a reservation")
	}
	if ok, _ := l.Refund(ctx, d.Reservation, 0, 0); ok {
		t.Fatal("refunding a refused request gave something back")
	}
}

func TestTooLargeNeverPasses(t *testing.T) {
	l, rdb := newLimiter(t)
	b := tok("acme", 100, 10, 101)
	d, err := l.Reserve(context.Background(), "big", []Bucket{b})
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != TooLarge || d.Bucket == nil || d.RetryAfter != 0 {
		t.Fatalf("decision %+v, want too large", d)
	}
	if level(t, rdb, l, b) != 100 {
		t.Fatal("a too-large request was charged")
	}
}

func TestRetryAfterIsWhenEnoughHasRefilled(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	if d, _ := l.Reserve(ctx, "drain", []Bucket{tok("acme", 10, 1, 10)}); d.Status != Allowed {
		t.Fatal("drain refused")
	}
	d, _ := l.Reserve(ctx, "next", []Bucket{tok("acme", 10, 1, 5)})
	if d.Status != Limited || d.RetryAfter < 4*time.Second || d.RetryAfter > 5*time.Second+time.Millisecond {
		t.Fatalf("decision %+v, want limited for ~5s", d)
	}
}

// A script that floors each refill to whole tokens starves frequent
// callers: each call sees less than a token's worth of time, so the bucket
// never refills at all. Here, tiny charges every 20 ms while 10 tokens/s
// flow in must leave the bucket nearly full.
func TestFractionalRefillIsKept(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	if d, _ := l.Reserve(ctx, "drain", []Bucket{tok("acme", 5, 10, 5)}); d.Status != Allowed {
		t.Fatal("drain refused")
	}
	start := time.Now()
	for i := 0; i < 25; i++ {
		time.Sleep(20 * time.Millisecond)
		if d, _ := l.Reserve(ctx, fmt.Sprint("tiny", i), []Bucket{tok("acme", 5, 10, 0.001)}); d.Status != Allowed {
			t.Fatalf("tiny charge %d refused: %+v", i, d)
		}
	}
	want := math.Min(5, 10*time.Since(start).Seconds()) - 25*0.001
	d, _ := l.Reserve(ctx, "probe", []Bucket{tok("acme", 5, 10, 4)})
	if d.Status != Allowed {
		t.Fatalf("after %v of refill the bucket could not pay 4 (expected ~%.2f): %+v", time.Since(start), want, d)
	}
}

func TestRefundGivesBackUnusedOnce(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	toks := tok("acme", 1000, 0.001, 1000)
	reqs := Bucket{Dimension: "tenant", ID: "acme", Kind: Requests, Capacity: 5, PerSecond: 0.001, Cost: 1}
	d, _ := l.Reserve(ctx, "r", []Bucket{toks, reqs})
	if d.Status != Allowed || d.Reservation == "" {
		t.Fatalf("reserve: %+v", d)
	}
	ok, err := l.Refund(ctx, d.Reservation, 300, 0)
	if err != nil || !ok {
		t.Fatalf("refund: %v %v", ok, err)
	}
	if got := level(t, rdb, l, toks); math.Abs(got-700) > 0.5 {
		t.Fatalf("tokens after refunding 700 unused: %v", got)
	}
	if got := level(t, rdb, l, reqs); math.Abs(got-5) > 0.01 {
		t.Fatalf("requests after refunding an unserved request: %v", got)
	}
	ok, _ = l.Refund(ctx, d.Reservation, 0, 0)
	if ok {
		t.Fatal("second refund succeeded")
	}
	if got := level(t, rdb, l, toks); math.Abs(got-700) > 0.5 {
		t.Fatalf("second refund changed the level to %v", got)
	}
	if ok, _ := l.Refund(ctx, "", 0, 0); ok {
		t.Fatal("refund without a reservation")
	}
	if _, err := l.Refund(ctx, "not a reservation", 0, 0); err == nil {
		t.Fatal("refund of garbage: no error")
	}
	// The reservation hash goes with its last field.
	hash := strings.Split(d.Reservation, "\n")[1]
	if n := rdb.Exists(ctx, hash).Val(); n != 0 {
		t.Fatalf("reservation hash %s still there after its only refund", hash)
	}
}

func TestRefundNeverExceedsCapacity(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	b := tok("acme", 100, 1000, 60) // refills 1000/s: full again almost at once
	d, _ := l.Reserve(ctx, "r", []Bucket{b})
	time.Sleep(100 * time.Millisecond)
	if ok, err := l.Refund(ctx, d.Reservation, 0, 0); err != nil || !ok {
		t.Fatalf("refund: %v %v", ok, err)
	}
	if got := level(t, rdb, l, b); got > 100 {
		t.Fatalf("level %v above capacity 100", got)
	}
}

// A bucket key may expire once the bucket is full again (absent = full),
// never before; and it does not outlive a refill from empty by more than
// a second.
func TestKeysExpireWhenFull(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	b := tok("acme", 100, 10, 50) // 5 s to refill; 10 s from empty
	first, _ := l.Reserve(ctx, "r", []Bucket{b})
	ttl := rdb.PTTL(ctx, l.bucketKey(b)).Val()
	if ttl < 5*time.Second || ttl > 11*time.Second+time.Millisecond {
		t.Fatalf("bucket ttl %v, want between time to full and capacity/rate + 1s", ttl)
	}
	// Charges that keep it below full keep its TTL ahead of its time to
	// full, whether they rewrite the TTL or keep it.
	for i := 0; i < 6; i++ {
		time.Sleep(300 * time.Millisecond)
		d, _ := l.Reserve(ctx, fmt.Sprint("more", i), []Bucket{tok("acme", 100, 10, 5)})
		if d.Status != Allowed {
			t.Fatalf("charge %d refused: %+v", i, d)
		}
		toFull := time.Duration((100 - level(t, rdb, l, b)) / 10 * float64(time.Second))
		if ttl := rdb.PTTL(ctx, l.bucketKey(b)).Val(); ttl < toFull || ttl > 11*time.Second+time.Millisecond {
			t.Fatalf("after charge %d: ttl %v, time to full %v", i, ttl, toFull)
		}
	}
	if ttl := rdb.PTTL(ctx, strings.Split(first.Reservation, "\n")[1]).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("reservation ttl %v", ttl)
	}
}

func TestScriptReloadAfterFlush(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := l.Reserve(ctx, "r", []Bucket{tok("acme", 10, 1, 1)})
	if err != nil || d.Status != Allowed {
		t.Fatalf("reserve after SCRIPT FLUSH: %+v %v", d, err)
	}
	rdb.ScriptFlush(ctx)
	if ok, err := l.Refund(ctx, d.Reservation, 0, 0); err != nil || !ok {
		t.Fatalf("refund after SCRIPT FLUSH: %v %v", ok, err)
	}
}

// Several limiter instances (separate connections, as separate API
// processes) charging one tenant at once never admit more than the bucket
// holds plus what refilled meanwhile.
func TestNoOverAdmissionAcrossInstances(t *testing.T) {
	t.Run("one call each", func(t *testing.T) { noOverAdmission(t, Options{}) })
	t.Run("coalesced", func(t *testing.T) { noOverAdmission(t, Options{Batchers: 2, MaxBatch: 8}) })
}

func noOverAdmission(t *testing.T, opts Options) {
	const instances, capacity, perSec = 8, 2000.0, 500.0
	prefix := testenv.KeyPrefix(t)
	var admitted atomic.Int64 // in hundredths of a token
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(1500 * time.Millisecond)
	for i := 0; i < instances; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer rdb.Close()
			o := opts
			o.KeyPrefix = prefix
			l := New(rdb, o)
			defer l.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for n := 0; time.Now().Before(deadline); n++ {
				cost := float64(1+rng.IntN(5000)) / 100
				d, err := l.Reserve(context.Background(), fmt.Sprintf("i%d-%d", i, n), []Bucket{tok("acme", capacity, perSec, cost)})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Status == Allowed {
					admitted.Add(int64(math.Round(cost * 100)))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	got := float64(admitted.Load()) / 100
	bound := capacity + perSec*elapsed
	if got > bound+0.01 {
		t.Fatalf("admitted %.2f tokens in %.2fs, bound %.2f", got, elapsed, bound)
	}
	if got < capacity {
		t.Fatalf("admitted only %.2f: the bucket was not used", got)
	}
	t.Logf("admitted %.2f of at most %.2f tokens", got, bound)
}

func TestPolicyBuckets(t *testing.T) {
	p := Policy{
		Tenant: Rate{TokensPerMinute: 600, RequestsPerMinute: 60, RequestBurst: 10},
		IP:     Rate{RequestsPerMinute: 120},
	}
	bs := p.Buckets(Caller{Tenant: "acme", User: "alice", IP: "10.0.0.1"}, 250)
	if len(bs) != 3 {
		t.Fatalf("buckets %+v", bs)
	}
	want := []Bucket{
		{Dimension: "tenant", ID: "acme", Kind: Tokens, Capacity: 600, PerSecond: 10, Cost: 250, Group: "t:acme"},
		{Dimension: "tenant", ID: "acme", Kind: Requests, Capacity: 10, PerSecond: 1, Cost: 1, Group: "t:acme"},
		{Dimension: "ip", ID: "10.0.0.1", Kind: Requests, Capacity: 120, PerSecond: 2, Cost: 1, Group: "ip:10.0.0.1"},
	}
	for i := range want {
		if bs[i] != want[i] {
			t.Errorf("bucket %d = %+v, want %+v", i, bs[i], want[i])
		}
	}
	if bs := p.Buckets(Caller{}, 1); len(bs) != 0 {
		t.Fatalf("an unidentified caller got buckets %+v", bs)
	}
}

func BenchmarkReserve(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	l := New(rdb, Options{KeyPrefix: "bench:"})
	bs := Policy{Tenant: Rate{TokensPerMinute: 1e12, RequestsPerMinute: 1e12}, User: Rate{TokensPerMinute: 1e12}}.
		Buckets(Caller{Tenant: "acme", User: "alice"}, 500)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.Reserve(ctx, strconv.Itoa(i), bs); err != nil {
			b.Fatal(err)
		}
	}
}

// A Reserve whose reply is lost may still have charged: its error comes
// with the reservation, and refunding that gives the charge back (once).
// A busy script on another connection holds Redis past the client's read
// timeout; Redis then reads the request the client gave up on and runs it.
func TestLostReplyIsRefundable(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer rdb.Close()
	l := New(rdb, Options{KeyPrefix: testenv.KeyPrefix(t), ReservationTTL: time.Minute})
	admin := srv.Client(t)
	ctx := context.Background()
	b := tok("acme", 10, 0.001, 10)
	// Load the script first: a paused EVALSHA of an unknown script would
	// only come back NOSCRIPT.
	if d, err := l.Reserve(ctx, "warm", []Bucket{tok("warm", 10, 1, 1)}); err != nil || d.Status != Allowed {
		t.Fatalf("warm-up: %+v %v", d, err)
	}
	busy := make(chan error, 1)
	go func() {
		busy <- admin.Eval(ctx, `local t = redis.call('TIME')
local until_us = t[1] * 1000000 + t[2] + 400000
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= until_us
return 1`, nil).Err()
	}()
	time.Sleep(100 * time.Millisecond)
	d, err := l.Reserve(ctx, "r", []Bucket{b})
	if err == nil {
		t.Fatalf("reserve during the pause answered: %+v", d)
	}
	if d.Reservation == "" {
		t.Fatal("a failed reserve came without its reservation")
	}
	deadline := time.Now().Add(3 * time.Second)
	for level(t, admin, l, b) > 0.01 {
		if time.Now().After(deadline) {
			t.Fatal("the paused script never charged the bucket")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Refund(ctx, d.Reservation, 0, 0); err != nil || !ok {
		t.Fatalf("refund after a lost reply: %v %v", ok, err)
	}
	if got := level(t, admin, l, b); math.Abs(got-10) > 0.01 {
		t.Fatalf("level %v after the refund, want 10", got)
	}
	if ok, _ := l.Refund(ctx, d.Reservation, 0, 0); ok {
		t.Fatal("second refund succeeded")
	}
}

// Coalesced, concurrent requests get exactly the decisions they would get
// one at a time: a bucket of 100 lets exactly 100 of 300 through.
func TestCoalescedDecisions(t *testing.T) {
	rdb := srv.Client(t)
	l := New(rdb, Options{KeyPrefix: testenv.KeyPrefix(t), Batchers: 2, MaxBatch: 16})
	defer l.Close()
	b := tok("acme", 100, 0.0001, 1)
	var allowed, limited atomic.Int64
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := l.Reserve(context.Background(), fmt.Sprint("r", i), []Bucket{b})
			switch {
			case err != nil:
				t.Error(err)
			case d.Status == Allowed:
				allowed.Add(1)
			case d.Status == Limited && d.Bucket != nil && d.RetryAfter > time.Hour:
				limited.Add(1)
			default:
				t.Errorf("decision %+v", d)
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 100 || limited.Load() != 200 {
		t.Fatalf("allowed %d, limited %d; want 100 and 200", allowed.Load(), limited.Load())
	}
	if got := level(t, rdb, l, b); got > 0.01 {
		t.Fatalf("level %v after 100 charges of 1 from 100", got)
	}
}

// In one batch, each request charged has its own reservation, refunded
// on its own; a refused one has none. Later requests see earlier charges.
func TestBatchReservations(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	r1, _ := l.encode("a", []Bucket{tok("acme", 10, 0.001, 4)})
	r2, _ := l.encode("b", []Bucket{tok("acme", 10, 0.001, 7)}) // 6 left: refused
	r3, _ := l.encode("c", []Bucket{tok("acme", 10, 0.001, 5)})
	l.decide(ctx, []*reservation{r1, r2, r3})
	for i, want := range []Status{Allowed, Limited, Allowed} {
		r := []*reservation{r1, r2, r3}[i]
		if r.err != nil || r.decision.Status != want || (r.decision.Reservation != "") != (want == Allowed) {
			t.Fatalf("request %d: %+v %v", i+1, r.decision, r.err)
		}
	}
	b := tok("acme", 10, 0.001, 0)
	if got := level(t, rdb, l, b); math.Abs(got-1) > 0.01 {
		t.Fatalf("level %v, want 10 - 4 - 5 = 1", got)
	}
	if r1.decision.Remaining[0] != 6 || r3.decision.Remaining[0] != 1 {
		t.Fatalf("remaining after each: %v, %v", r1.decision.Remaining, r3.decision.Remaining)
	}
	if ok, err := l.Refund(ctx, r3.decision.Reservation, 0, 0); err != nil || !ok {
		t.Fatalf("refund 3: %v %v", ok, err)
	}
	if got := level(t, rdb, l, b); math.Abs(got-6) > 0.01 {
		t.Fatalf("level %v after refunding request 3, want 6", got)
	}
	hash := strings.Split(r1.decision.Reservation, "\n")[1]
	if n := rdb.HLen(ctx, hash).Val(); n != 1 {
		t.Fatalf("%d reservations left in the batch after one of two refunds, want 1", n)
	}
	if ok, err := l.Refund(ctx, r1.decision.Reservation, 1, 0); err != nil || !ok {
		t.Fatalf("refund 1: %v %v", ok, err)
	}
	if got := level(t, rdb, l, b); math.Abs(got-9) > 0.01 {
		t.Fatalf("level %v after refunding 3 of request 1's 4, want 9", got)
	}
	if n := rdb.Exists(ctx, hash).Val(); n != 0 {
		t.Fatal("the batch's reservation hash outlived its last reservation")
	}
}

// Reserve after Close fails rather than hangs.
func TestReserveAfterClose(t *testing.T) {
	l := New(srv.Client(t), Options{KeyPrefix: testenv.KeyPrefix(t), Batchers: 1})
	l.Close()
	l.Close()
	if _, err := l.Reserve(context.Background(), "r", []Bucket{tok("acme", 10, 1, 1)}); err == nil {
		t.Fatal("Reserve after Close succeeded")
	}
}

// BenchmarkDecideBatch is one script call deciding size requests, each
// against three buckets of its own caller (the tenant shared by ten
// callers), as the coalescing limiter sends them. redis-µs/decision is the
// time Redis itself spent, from INFO commandstats.
func BenchmarkDecideBatch(b *testing.B) {
	for _, size := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer rdb.Close()
			l := New(rdb, Options{KeyPrefix: "bench:", ReservationTTL: time.Minute})
			p := Policy{Tenant: Rate{TokensPerMinute: 1e9}, User: Rate{TokensPerMinute: 1e9}, IP: Rate{RequestsPerMinute: 1e9}}
			ctx := context.Background()
			rdb.ConfigResetStat(ctx)
			seq := 0
			batch := make([]*reservation, size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range batch {
					seq++
					c := seq % 20000
					caller := Caller{Tenant: fmt.Sprint("t", c/10), User: fmt.Sprint("u", c), IP: fmt.Sprint("ip", c)}
					batch[j], _ = l.encode(fmt.Sprint("b", seq), p.Buckets(caller, 600))
				}
				l.decide(ctx, batch)
				if batch[0].err != nil {
					b.Fatal(batch[0].err)
				}
			}
			b.StopTimer()
			info := rdb.Info(ctx, "commandstats").Val()
			for _, line := range strings.Split(info, "\r\n") {
				if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
					for _, kv := range strings.Split(rest, ",") {
						if v, ok := strings.CutPrefix(kv, "usec="); ok {
							us, _ := strconv.ParseFloat(v, 64)
							b.ReportMetric(us/float64(b.N*size), "redis-µs/decision")
						}
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*size), "µs/decision")
		})
	}
}

// Decided group by group, as on a cluster: a request that its second
// group refuses gets back what its first took, at once; one that both
// allow is refunded part by part, once.
func TestGroupsDecidedInTurn(t *testing.T) {
	l, rdb := newLimiter(t)
	l.splits = true
	ctx := context.Background()
	tenant := Bucket{Dimension: "tenant", ID: "acme", Kind: Tokens, Capacity: 1000, PerSecond: 0.001, Cost: 100, Group: TenantGroup("acme")}
	ip := Bucket{Dimension: "ip", ID: "10.0.0.1", Kind: Requests, Capacity: 1, PerSecond: 0.001, Cost: 1, Group: AddressGroup("10.0.0.1")}
	bs := []Bucket{tenant, ip}
	d, err := l.Reserve(ctx, "r1", bs)
	if err != nil || d.Status != Allowed || strings.Count(d.Reservation, "\n\n") != 1 {
		t.Fatalf("first: %+v %v; want allowed, a reservation of two parts", d, err)
	}
	d2, err := l.Reserve(ctx, "r2", bs)
	if err != nil || d2.Status != Limited || d2.Bucket == nil || d2.Bucket.Dimension != "ip" || d2.Reservation != "" {
		t.Fatalf("second: %+v %v; want refused by the ip bucket, nothing to refund", d2, err)
	}
	if got := level(t, rdb, l, tenant); math.Abs(got-900) > 0.01 {
		t.Fatalf("tenant level %v after a refusal by the ip, want 900: the tenant's charge was not given back", got)
	}
	ok, err := l.Refund(ctx, d.Reservation, 40, 1)
	if err != nil || !ok {
		t.Fatalf("refund: %v %v", ok, err)
	}
	if got := level(t, rdb, l, tenant); math.Abs(got-960) > 0.01 {
		t.Fatalf("tenant level %v after using 40 of 100, want 960", got)
	}
	if got := level(t, rdb, l, ip); got > 0.01 {
		t.Fatalf("ip level %v after using its request, want 0", got)
	}
	if ok, _ := l.Refund(ctx, d.Reservation, 0, 0); ok {
		t.Fatal("second refund succeeded")
	}
}

// A reservation of one part has the format from before bucket groups
// (r1), which the previous version refunds; one of two parts is refunded
// part by part.
func TestReservationFormats(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	b := tok("acme", 10, 0.001, 4)
	d, err := l.Reserve(ctx, "r", []Bucket{b, {Dimension: "ip", ID: "10.0.0.1", Kind: Requests, Capacity: 5, PerSecond: 0.001, Cost: 1}})
	if err != nil || d.Status != Allowed || !strings.HasPrefix(d.Reservation, "r1\n") {
		t.Fatalf("%+v %v; want allowed, a reservation in format r1", d, err)
	}
	l.splits = true
	d2, err := l.Reserve(ctx, "r2", []Bucket{b, {Dimension: "ip", ID: "10.0.0.1", Kind: Requests, Capacity: 5, PerSecond: 0.001, Cost: 1}})
	if err != nil || d2.Status != Allowed || !strings.HasPrefix(d2.Reservation, "r2\n") {
		t.Fatalf("%+v %v; want allowed, a reservation of two parts in format r2", d2, err)
	}
	for _, r := range []string{d.Reservation, d2.Reservation} {
		if ok, err := l.Refund(ctx, r, 1, 1); err != nil || !ok {
			t.Fatalf("refund of %q: %v %v", r, ok, err)
		}
	}
	if got := level(t, rdb, l, b); math.Abs(got-8) > 0.01 {
		t.Fatalf("level %v after two requests used 1 of 4 each, want 8", got)
	}
}
