// Package limiter is Sluice's rate limiter at the door: token buckets in
// Redis, one per dimension (tenant, user, client IP) and kind (tokens or
// requests), checked and charged all at once by one Lua script, so that
// many API instances share one limit and a refused request costs nothing.
//
// A request is charged its estimate up front (reserve) and given back what
// it did not use when it ends (refund, exactly once), so that concurrent
// requests cannot overrun a limit that is only charged after the fact.
package limiter

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/bucket.lua
	bucketLua string
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/refund.lua
	refundLua string

	// Script.Run is EVALSHA with a fallback to EVAL on NOSCRIPT, so a Redis
	// restart that empties the script cache costs one extra round trip.
	reserveScript = redis.NewScript(bucketLua + reserveLua)
	refundScript  = redis.NewScript(bucketLua + refundLua)
)

// Kind is what a bucket counts.
type Kind string

const (
	// Tokens buckets count LLM tokens (prompt + max output), TPM-style.
	Tokens Kind = "tokens"
	// Requests buckets count requests, RPM-style.
	Requests Kind = "requests"
)

// Bucket is one token bucket a request is charged against.
type Bucket struct {
	// Dimension and ID name it: ("tenant", "acme"), ("ip", "10.0.0.7").
	Dimension string
	ID        string
	Kind      Kind
	// Capacity is the bucket size (the largest burst); PerSecond its
	// refill rate.
	Capacity  float64
	PerSecond float64
	// Cost is what this request takes from it.
	Cost float64
}

func (b Bucket) String() string { return fmt.Sprintf("%s %s (%s)", b.Dimension, b.ID, b.Kind) }

// Status is a reservation's outcome.
type Status int

const (
	// Allowed: every bucket was charged.
	Allowed Status = 1
	// Limited: a bucket lacks tokens now; retry after RetryAfter.
	Limited Status = 2
	// TooLarge: the cost exceeds a bucket's capacity; retrying never helps.
	TooLarge Status = 3
)

// Decision is the outcome of Reserve.
type Decision struct {
	Status Status
	// Bucket is the one that refused (Limited, TooLarge).
	Bucket *Bucket
	// RetryAfter is when the refusing bucket will hold the cost.
	RetryAfter time.Duration
	// Remaining and ResetAfter are, per bucket in the order given, its
	// level after the decision and the time until it is full again.
	Remaining  []float64
	ResetAfter []time.Duration
}

// Limiter reserves and refunds against buckets in Redis.
type Limiter struct {
	rdb    redis.Scripter
	prefix string
	ttl    time.Duration

	// With coalescing: concurrent Reserve calls wait here for one of the
	// batchers, which decides everything waiting in one script call.
	queue    chan *reservation
	maxBatch int
	timeout  time.Duration
	quit     chan struct{}
	stopped  sync.WaitGroup
	// closing guards closed: a Reserve hands over under a read lock, so
	// that once Close holds the write lock nothing more can arrive.
	closing sync.RWMutex
	closed  bool
}

// Options configures a Limiter.
type Options struct {
	// KeyPrefix namespaces the keys ("sluice:").
	KeyPrefix string
	// ReservationTTL is how long an unrefunded reservation is kept; it must
	// outlast the longest request. A reservation that expires is simply
	// never refunded (the caller was charged its whole estimate).
	ReservationTTL time.Duration
	// Batchers, when above zero, turns on coalescing: that many
	// goroutines each take every Reserve waiting (up to MaxBatch) and
	// decide them in one script call. A lone request goes at once, so
	// coalescing costs nothing when idle; under load it divides Redis's
	// per-call cost among the batch. Close stops the batchers.
	Batchers int
	// MaxBatch caps one call's requests (default 64).
	MaxBatch int
	// BatchTimeout bounds one batched call (default 5s); the callers'
	// own contexts cannot, since one call serves many of them.
	BatchTimeout time.Duration
}

// New returns a Limiter.
func New(rdb redis.Scripter, opts Options) *Limiter {
	if opts.ReservationTTL <= 0 {
		opts.ReservationTTL = time.Hour
	}
	l := &Limiter{rdb: rdb, prefix: opts.KeyPrefix, ttl: opts.ReservationTTL}
	if opts.Batchers > 0 {
		l.maxBatch = cmp.Or(opts.MaxBatch, 64)
		l.timeout = cmp.Or(opts.BatchTimeout, 5*time.Second)
		l.queue = make(chan *reservation, l.maxBatch*opts.Batchers)
		l.quit = make(chan struct{})
		for range opts.Batchers {
			l.stopped.Add(1)
			go l.batcher()
		}
	}
	return l
}

// Close stops the batchers once what they hold is decided. Reserve after
// Close fails.
func (l *Limiter) Close() {
	if l.quit == nil {
		return
	}
	l.closing.Lock()
	if !l.closed {
		l.closed = true
		close(l.quit)
	}
	l.closing.Unlock()
	l.stopped.Wait()
}

// errClosed is Reserve after Close.
var errClosed = errors.New("limiter closed")

func (l *Limiter) bucketKey(b Bucket) string {
	return l.prefix + keyspace + b.Dimension + ":" + b.ID + ":" + string(b.Kind)
}

func (l *Limiter) reservationKey(id string) string { return l.prefix + keyspace + "rsv:" + id }

// keyspace names the limiter's keys with the version of their format
// (lua/bucket.lua, the reservation record): after an upgrade the scripts
// never meet a key in an older format (a WRONGTYPE error for every
// request); the old keys expire on their own, and requests in flight at
// the upgrade keep their whole charge rather than fail their refund.
const keyspace = "rl2:"

// reservation is one Reserve call: its arguments, encoded for the script,
// and once decided, its outcome.
type reservation struct {
	id      string
	buckets []Bucket
	keys    []string
	args    []any // n, then capacity, rate, cost per bucket, then ttl, record

	decision Decision
	err      error
	done     chan struct{}
}

// Reserve charges every bucket its cost under reservationID, or none of
// them. Calling it again with the same reservationID charges nothing more.
func (l *Limiter) Reserve(ctx context.Context, reservationID string, buckets []Bucket) (Decision, error) {
	if len(buckets) == 0 {
		return Decision{Status: Allowed}, nil
	}
	r, err := l.encode(reservationID, buckets)
	if err != nil {
		return Decision{}, err
	}
	if l.queue == nil {
		l.decide(ctx, []*reservation{r})
		return r.decision, r.err
	}
	r.done = make(chan struct{})
	l.closing.RLock()
	if l.closed {
		l.closing.RUnlock()
		return Decision{}, fmt.Errorf("reserve rate limits for %s: %w", reservationID, errClosed)
	}
	select {
	case l.queue <- r:
		l.closing.RUnlock()
	case <-ctx.Done():
		l.closing.RUnlock()
		// Not handed over: nothing was or will be charged.
		return Decision{}, fmt.Errorf("reserve rate limits for %s: %w", reservationID, ctx.Err())
	}
	// Handed over, it may be charged whatever ctx does now, so the answer
	// is awaited (the batch's own timeout bounds the wait): a caller that
	// gave up early could not know whether to refund.
	<-r.done
	return r.decision, r.err
}

func (l *Limiter) encode(id string, buckets []Bucket) (*reservation, error) {
	n := len(buckets)
	r := &reservation{id: id, buckets: buckets, keys: make([]string, 0, n+1), args: make([]any, 0, 3+3*n)}
	r.args = append(r.args, n)
	var record strings.Builder
	for _, b := range buckets {
		if b.Capacity <= 0 || b.PerSecond <= 0 || b.Cost < 0 {
			return nil, fmt.Errorf("reserve: bucket %s needs capacity and rate > 0 and cost >= 0", b)
		}
		key := l.bucketKey(b)
		if strings.ContainsAny(key, "\n\r") {
			return nil, fmt.Errorf("reserve: bucket %s: an id may not contain a line break", b)
		}
		r.keys = append(r.keys, key)
		capacity, rate, cost := formatFloat(b.Capacity), formatFloat(b.PerSecond), formatFloat(b.Cost)
		r.args = append(r.args, capacity, rate, cost)
		// One line per bucket for refund.lua: capacity rate cost kind key.
		kind := "t"
		if b.Kind == Requests {
			kind = "r"
		}
		if record.Len() > 0 {
			record.WriteByte('\n')
		}
		for _, f := range []string{capacity, " ", rate, " ", cost, " ", kind, " ", key} {
			record.WriteString(f)
		}
	}
	r.keys = append(r.keys, l.reservationKey(id))
	r.args = append(r.args, l.ttl.Milliseconds(), record.String())
	return r, nil
}

// batcher decides whatever is waiting, a batch per script call, until
// Close; then it decides what is left in the queue (nothing can be added
// by then) and returns.
func (l *Limiter) batcher() {
	defer l.stopped.Done()
	batch := make([]*reservation, 0, l.maxBatch)
	for {
		var first *reservation
		select {
		case first = <-l.queue:
		case <-l.quit:
			select {
			case first = <-l.queue:
			default:
				return
			}
		}
		batch = append(batch[:0], first)
	fill:
		for len(batch) < l.maxBatch {
			select {
			case r := <-l.queue:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		l.decide(ctx, batch)
		cancel()
		for _, r := range batch {
			close(r.done)
		}
	}
}

// decide runs reserve.lua for rs, in order, and fills in their decisions.
func (l *Limiter) decide(ctx context.Context, rs []*reservation) {
	var keys []string
	args := []any{len(rs)}
	for _, r := range rs {
		keys = append(keys, r.keys...)
		args = append(args, r.args...)
	}
	raw, err := reserveScript.Run(ctx, l.rdb, keys, args...).Int64Slice()
	if err == nil {
		want := 0
		for _, r := range rs {
			want += 3 + len(r.buckets)
		}
		if len(raw) != want {
			err = fmt.Errorf("reply of %d values, want %d", len(raw), want)
		}
	}
	for _, r := range rs {
		if err != nil {
			r.err = fmt.Errorf("reserve rate limits for %s: %w", r.id, err)
			continue
		}
		n := len(r.buckets)
		d := Decision{Status: Status(raw[0]), RetryAfter: time.Duration(raw[2]) * time.Microsecond,
			Remaining: make([]float64, n), ResetAfter: make([]time.Duration, n)}
		if i := int(raw[1]); i >= 1 && i <= n {
			b := r.buckets[i-1]
			d.Bucket = &b
		}
		for i, b := range r.buckets {
			d.Remaining[i] = float64(raw[3+i]) / 1000
			d.ResetAfter[i] = seconds((b.Capacity - d.Remaining[i]) / b.PerSecond)
		}
		r.decision = d
		raw = raw[3+n:]
	}
}

// Refund gives back what a reservation did not use: each tokens bucket
// gets cost − usedTokens, each requests bucket cost − usedRequests (never
// below zero, never above capacity). It refunds at most once; refunded is
// false when there was nothing to refund (already done, never reserved, or
// expired).
func (l *Limiter) Refund(ctx context.Context, reservationID string, usedTokens, usedRequests float64) (refunded bool, err error) {
	n, err := refundScript.Run(ctx, l.rdb, []string{l.reservationKey(reservationID)},
		formatFloat(usedTokens), formatFloat(usedRequests)).Int()
	if err != nil {
		return false, fmt.Errorf("refund rate limits for %s: %w", reservationID, err)
	}
	return n == 1, nil
}

// StoredLevel decodes a bucket key's value (see lua/bucket.lua): its level
// as of its last change. ok is false if raw is not a bucket state.
func StoredLevel(raw string) (level float64, ok bool) {
	if len(raw) != 24 {
		return 0, false
	}
	return math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[:8]))), true
}

func formatFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

func seconds(s float64) time.Duration {
	if s <= 0 || math.IsNaN(s) {
		return 0
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}
