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
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// Reservation is what Refund needs to give back the unused part of
	// the charge: opaque text of a few hundred bytes, fit to carry in a
	// workflow input. Set when the request was charged, and also when
	// Reserve fails after its call may have reached Redis (the reply may
	// be what was lost): refunding it then returns whatever was taken.
	// Empty when nothing was or can have been charged.
	Reservation string
}

// Limiter reserves and refunds against buckets in Redis.
type Limiter struct {
	rdb    redis.Scripter
	prefix string
	ttl    time.Duration
	// Each script call writes its reservations to a hash of its own,
	// named by this limiter's random id and a counter.
	id  string
	seq atomic.Uint64

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
	var id [8]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	l := &Limiter{rdb: rdb, prefix: opts.KeyPrefix, ttl: opts.ReservationTTL, id: hex.EncodeToString(id[:])}
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

// batchKey names the reservation hash of one script call.
func (l *Limiter) batchKey() string {
	return l.prefix + keyspace + "rb:" + l.id + ":" + strconv.FormatUint(l.seq.Add(1), 36)
}

// keyspace names the limiter's keys with the version of their format
// (lua/bucket.lua, the reservation hash): after an upgrade the scripts
// never meet a key in an older format (a WRONGTYPE error for every
// request); the old keys expire on their own. Requests in flight at an
// upgrade that changes the Reservation format keep their whole charge
// (Refund does not know their reservation).
const keyspace = "rl2:"

// reservation is one Reserve call: its arguments, encoded for the script,
// and once decided, its outcome.
type reservation struct {
	id      string
	buckets []Bucket
	keys    []string
	packed  []byte // n, then capacity, rate, cost per bucket (see reserve.lua)

	decision Decision
	err      error
	done     chan struct{}
}

// Reserve charges every bucket its cost, or none of them; id names the
// request in errors. Refund(d.Reservation) gives back what it does not use.
func (l *Limiter) Reserve(ctx context.Context, id string, buckets []Bucket) (Decision, error) {
	if len(buckets) == 0 {
		return Decision{Status: Allowed}, nil
	}
	r, err := l.encode(id, buckets)
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
		return Decision{}, fmt.Errorf("reserve rate limits for %s: %w", id, errClosed)
	}
	select {
	case l.queue <- r:
		l.closing.RUnlock()
	case <-ctx.Done():
		l.closing.RUnlock()
		// Not handed over: nothing was or will be charged.
		return Decision{}, fmt.Errorf("reserve rate limits for %s: %w", id, ctx.Err())
	}
	// Handed over, it may be charged whatever ctx does now, so the answer
	// is awaited (the batch's own timeout bounds the wait): a caller that
	// gave up early could not know whether to refund.
	<-r.done
	return r.decision, r.err
}

func (l *Limiter) encode(id string, buckets []Bucket) (*reservation, error) {
	n := len(buckets)
	if n > 255 {
		return nil, fmt.Errorf("reserve: %d buckets, at most 255", n)
	}
	r := &reservation{id: id, buckets: buckets, keys: make([]string, 0, n), packed: make([]byte, 1, 1+24*n)}
	r.packed[0] = byte(n)
	for _, b := range buckets {
		if !(b.Capacity > 0 && b.PerSecond > 0 && b.Cost >= 0) || math.IsInf(b.Capacity, 0) || math.IsInf(b.PerSecond, 0) || math.IsInf(b.Cost, 0) {
			return nil, fmt.Errorf("reserve: bucket %s needs finite capacity and rate > 0 and cost >= 0", b)
		}
		key := l.bucketKey(b)
		if strings.ContainsAny(key, "\n\r") {
			return nil, fmt.Errorf("reserve: bucket %s: an id may not contain a line break", b)
		}
		r.keys = append(r.keys, key)
		for _, x := range []float64{b.Capacity, b.PerSecond, b.Cost} {
			r.packed = binary.LittleEndian.AppendUint64(r.packed, math.Float64bits(x))
		}
	}
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
	var packed []byte
	for _, r := range rs {
		keys = append(keys, r.keys...)
		packed = append(packed, r.packed...)
	}
	rsv := l.batchKey()
	keys = append(keys, rsv)
	raw, err := reserveScript.Run(ctx, l.rdb, keys, len(rs), packed, l.ttl.Milliseconds()).Int64Slice()
	if err == nil {
		want := 0
		for _, r := range rs {
			want += 3 + len(r.buckets)
		}
		if len(raw) != want {
			err = fmt.Errorf("reply of %d values, want %d", len(raw), want)
		}
	}
	for i, r := range rs {
		if err != nil {
			// The call may have run and charged; the reservation lets
			// the caller give that back.
			r.decision = Decision{Reservation: encodeReservation(rsv, i+1, r)}
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
		if d.Status == Allowed {
			d.Reservation = encodeReservation(rsv, i+1, r)
		}
		r.decision = d
		raw = raw[3+n:]
	}
}

// A Reservation is text: a version line, the reservation hash, the field,
// then one line per bucket, "<capacity> <rate> <cost> <t|r> <key>".
const reservationVersion = "r1"

func encodeReservation(hash string, field int, r *reservation) string {
	var sb strings.Builder
	sb.WriteString(reservationVersion + "\n" + hash + "\n" + strconv.Itoa(field))
	for i, b := range r.buckets {
		kind := " t "
		if b.Kind == Requests {
			kind = " r "
		}
		sb.WriteString("\n" + formatFloat(b.Capacity) + " " + formatFloat(b.PerSecond) + " " + formatFloat(b.Cost) + kind + r.keys[i])
	}
	return sb.String()
}

// Refund gives back what a reservation did not use: each tokens bucket
// gets cost − usedTokens, each requests bucket cost − usedRequests (never
// below zero, never above capacity). It refunds at most once; refunded is
// false when there was nothing to refund (already done, never charged, or
// expired). An empty reservation refunds nothing.
func (l *Limiter) Refund(ctx context.Context, reservation string, usedTokens, usedRequests float64) (refunded bool, err error) {
	if reservation == "" {
		return false, nil
	}
	lines := strings.Split(reservation, "\n")
	if len(lines) < 4 || lines[0] != reservationVersion {
		return false, fmt.Errorf("refund rate limits: not a reservation: %.40q", reservation)
	}
	keys := []string{lines[1]}
	args := []any{lines[2], formatFloat(usedTokens), formatFloat(usedRequests)}
	for _, line := range lines[3:] {
		f := strings.SplitN(line, " ", 5)
		if len(f) != 5 {
			return false, fmt.Errorf("refund rate limits: bad bucket line %q", line)
		}
		keys = append(keys, f[4])
		args = append(args, f[0], f[1], f[2], f[3])
	}
	n, err := refundScript.Run(ctx, l.rdb, keys, args...).Int()
	if err != nil {
		return false, fmt.Errorf("refund rate limits for %s: %w", lines[1]+"#"+lines[2], err)
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
