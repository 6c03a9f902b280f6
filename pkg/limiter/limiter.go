// Package limiter is Sluice's rate limiter at the door: token buckets in
// Redis, one per dimension (tenant, user, client IP) and kind (tokens or
// requests), checked and charged all at once by one Lua script, so that
// many API instances share one limit and a refused request costs nothing.
//
// A request is charged its estimate up front (reserve) and given back what
// it did not use when it ends (refund, exactly once), so that concurrent
// requests cannot overrun a limit that is only charged after the fact.
//
// On Redis Cluster one script can only touch one hash slot, and a
// request's buckets are in several by nature: its tenant's are shared
// with the tenant's other callers, its address's with other tenants'
// callers at that address. Buckets are therefore grouped (Bucket.Group,
// one hash tag per group; Policy.Buckets puts a tenant and its users in
// one group, an address in another), and on a cluster client a request is
// decided group by group, in the order its buckets name them: each group
// all or nothing in one script call, and when a later group refuses, what
// the earlier ones took is given back at once. The trade-off: between
// that charge and its return (one round trip) the earlier group's buckets
// look lower to concurrent requests, which a single call never shows; and
// a process that dies in between leaves that charge to refill by itself.
// Put the group most likely to refuse first (Policy.Buckets puts the
// tenant first: quotas refuse far more often than an address, whose
// floods the bans stop before the limiter). A plain client talks to one
// Redis, where every group goes in one call as before.
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

	"github.com/sluice-dev/sluice/pkg/hashtag"
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
	// Group names the buckets whose keys share one Redis Cluster hash
	// slot with this one; a request's buckets of one group are always
	// decided in one step (see the package doc). Empty: a group of its
	// own, named by Dimension and ID.
	Group string
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
	// level after the decision and the time until it is full again. A
	// bucket that was not read — on a cluster, one of a group after the
	// group that refused — shows its capacity and 0.
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
	// splits: rdb sends keys of different slots to different servers,
	// so that one script call may only touch one bucket group.
	splits bool
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
	l := &Limiter{rdb: rdb, prefix: opts.KeyPrefix, ttl: opts.ReservationTTL, id: hex.EncodeToString(id[:]), splits: hashtag.Splits(rdb)}
	if opts.Batchers > 0 {
		l.maxBatch = cmp.Or(opts.MaxBatch, 64)
		l.timeout = cmp.Or(opts.BatchTimeout, 5*time.Second)
		l.queue = make(chan *reservation, l.maxBatch*opts.Batchers)
		l.quit = make(chan struct{})
		// The batchers are how Reserve is served, as a client's
		// connections are, so they live as long as the Limiter: from
		// New to Close, not under a process's loops.
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

// decide runs reserve.lua for rs, in order, and fills in their decisions:
// one call for all of them when the client does not split; else a round
// per part, each round one call per hash tag (concurrently), and then the
// charges of requests a later part refused are given back.
func (l *Limiter) decide(ctx context.Context, rs []*reservation) {
	for _, r := range rs {
		n := len(r.buckets)
		r.next, r.charged, r.finished, r.err = 0, nil, false, nil
		r.decision = Decision{Remaining: make([]float64, n), ResetAfter: make([]time.Duration, n)}
		for i, b := range r.buckets {
			r.decision.Remaining[i] = b.Capacity
		}
	}
	pending := rs
	for len(pending) > 0 {
		calls := l.calls(pending)
		if len(calls) == 1 {
			l.call(ctx, calls[0])
		} else {
			var wg sync.WaitGroup
			for _, c := range calls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l.call(ctx, c)
				}()
			}
			wg.Wait()
		}
		var next []*reservation
		for _, r := range pending {
			if !r.finished {
				next = append(next, r)
			}
		}
		pending = next
	}
	for _, r := range rs {
		if r.err == nil && r.decision.Status != Allowed && len(r.charged) > 0 {
			l.giveBack(ctx, r)
		}
	}
}

// calls groups the next part of every pending reservation by its hash
// tag, in order: one script call each (a single one when the client does
// not split).
func (l *Limiter) calls(pending []*reservation) [][]*reservation {
	if !l.splits {
		return [][]*reservation{pending}
	}
	var out [][]*reservation
	at := map[string]int{}
	for _, r := range pending {
		tag := r.parts[r.next].tag
		i, ok := at[tag]
		if !ok {
			i = len(out)
			at[tag] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	return out
}

// call decides the next part of each reservation of batch in one script
// call, in order.
func (l *Limiter) call(ctx context.Context, batch []*reservation) {
	var keys []string
	var packed []byte
	want := 0
	for _, r := range batch {
		p := &r.parts[r.next]
		for _, i := range p.buckets {
			keys = append(keys, r.keys[i])
		}
		packed = append(packed, p.packed...)
		want += 3 + len(p.buckets)
	}
	rsv := l.batchKey(batch[0].parts[batch[0].next].group)
	keys = append(keys, rsv)
	raw, err := reserveScript.Run(ctx, l.rdb, keys, len(batch), packed, l.ttl.Milliseconds()).Int64Slice()
	if err == nil && len(raw) != want {
		err = fmt.Errorf("reply of %d values, want %d", len(raw), want)
	}
	for i, r := range batch {
		p := &r.parts[r.next]
		r.finished = true
		if err != nil {
			// The call may have run and charged; the reservation lets
			// the caller give that back, with what earlier parts took.
			r.charged = append(r.charged, charge{hash: rsv, field: i + 1, part: p})
			r.decision.Reservation = r.encodeCharges()
			r.err = fmt.Errorf("reserve rate limits for %s: %w", r.id, err)
			continue
		}
		d := &r.decision
		for j, bi := range p.buckets {
			b := r.buckets[bi]
			d.Remaining[bi] = float64(raw[3+j]) / 1000
			d.ResetAfter[bi] = seconds((b.Capacity - d.Remaining[bi]) / b.PerSecond)
		}
		status := Status(raw[0])
		if status == Allowed {
			r.charged = append(r.charged, charge{hash: rsv, field: i + 1, part: p})
			if r.next++; r.next < len(r.parts) {
				r.finished = false
			} else {
				d.Status = Allowed
				d.Reservation = r.encodeCharges()
			}
		} else {
			d.Status = status
			d.RetryAfter = time.Duration(raw[2]) * time.Microsecond
			if j := int(raw[1]); j >= 1 && j <= len(p.buckets) {
				b := r.buckets[p.buckets[j-1]]
				d.Bucket = &b
			}
		}
		raw = raw[3+len(p.buckets):]
	}
}

// A Reservation is text: a version line, then per charged part the
// reservation hash, the field and one line per bucket, "<capacity> <rate>
// <cost> <t|r> <key>". A reservation of one part (always, but on a
// cluster) is r1, the format from before parts, so that a process of the
// version before them still refunds it during a rolling upgrade; one of
// several parts is r2, its parts apart by an empty line.
const (
	onePart   = "r1"
	manyParts = "r2"
)

// Refund gives back what a reservation did not use: each tokens bucket
// gets cost − usedTokens, each requests bucket cost − usedRequests (never
// below zero, never above capacity). It refunds at most once; refunded is
// false when there was nothing to refund (already done, never charged, or
// expired). An empty reservation refunds nothing.
func (l *Limiter) Refund(ctx context.Context, reservation string, usedTokens, usedRequests float64) (refunded bool, err error) {
	if reservation == "" {
		return false, nil
	}
	version, body, _ := strings.Cut(reservation, "\n")
	var parts []string
	switch version {
	case manyParts:
		parts = strings.Split(body, "\n\n")
	case onePart:
		parts = []string{body}
	default:
		return false, fmt.Errorf("refund rate limits: not a reservation: %.40q", reservation)
	}
	// Each part is refunded once on its own, so a retry after a failure
	// gives back only the parts still owed.
	var errs []error
	for _, p := range parts {
		lines := strings.Split(p, "\n")
		if len(lines) < 3 {
			return false, fmt.Errorf("refund rate limits: not a reservation: %.40q", reservation)
		}
		ok, err := l.refundPart(ctx, lines[0], lines[1], lines[2:], usedTokens, usedRequests)
		if err != nil {
			errs = append(errs, err)
		}
		refunded = refunded || ok
	}
	return refunded, errors.Join(errs...)
}

// refundPart runs refund.lua for the field of one reservation hash and
// its bucket lines.
func (l *Limiter) refundPart(ctx context.Context, hash, field string, lines []string, usedTokens, usedRequests float64) (bool, error) {
	keys := []string{hash}
	args := []any{field, formatFloat(usedTokens), formatFloat(usedRequests)}
	for _, line := range lines {
		f := strings.SplitN(line, " ", 5)
		if len(f) != 5 {
			return false, fmt.Errorf("refund rate limits: bad bucket line %q", line)
		}
		keys = append(keys, f[4])
		args = append(args, f[0], f[1], f[2], f[3])
	}
	n, err := refundScript.Run(ctx, l.rdb, keys, args...).Int()
	if err != nil {
		return false, fmt.Errorf("refund rate limits for %s: %w", hash+"#"+field, err)
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
