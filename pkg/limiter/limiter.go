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
	"context"
	_ "embed"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/refund.lua
	refundLua string

	// Script.Run is EVALSHA with a fallback to EVAL on NOSCRIPT, so a Redis
	// restart that empties the script cache costs one extra round trip.
	reserveScript = redis.NewScript(reserveLua)
	refundScript  = redis.NewScript(refundLua)
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
}

// Options configures a Limiter.
type Options struct {
	// KeyPrefix namespaces the keys ("sluice:").
	KeyPrefix string
	// ReservationTTL is how long an unrefunded reservation is kept; it must
	// outlast the longest request. A reservation that expires is simply
	// never refunded (the caller was charged its whole estimate).
	ReservationTTL time.Duration
}

// New returns a Limiter.
func New(rdb redis.Scripter, opts Options) *Limiter {
	if opts.ReservationTTL <= 0 {
		opts.ReservationTTL = time.Hour
	}
	return &Limiter{rdb: rdb, prefix: opts.KeyPrefix, ttl: opts.ReservationTTL}
}

func (l *Limiter) bucketKey(b Bucket) string {
	return l.prefix + "rl:" + b.Dimension + ":" + b.ID + ":" + string(b.Kind)
}

func (l *Limiter) reservationKey(id string) string { return l.prefix + "rl:rsv:" + id }

// Reserve charges every bucket its cost under reservationID, or none of
// them. Calling it again with the same reservationID charges nothing more.
func (l *Limiter) Reserve(ctx context.Context, reservationID string, buckets []Bucket) (Decision, error) {
	if len(buckets) == 0 {
		return Decision{Status: Allowed}, nil
	}
	keys := make([]string, 0, len(buckets)+1)
	args := make([]any, 0, 2+4*len(buckets))
	args = append(args, len(buckets))
	for _, b := range buckets {
		if b.Capacity <= 0 || b.PerSecond <= 0 || b.Cost < 0 {
			return Decision{}, fmt.Errorf("reserve: bucket %s needs capacity and rate > 0 and cost >= 0", b)
		}
		keys = append(keys, l.bucketKey(b))
		kind := "t"
		if b.Kind == Requests {
			kind = "r"
		}
		args = append(args, formatFloat(b.Capacity), formatFloat(b.PerSecond), formatFloat(b.Cost), kind)
	}
	keys = append(keys, l.reservationKey(reservationID))
	args = append(args, l.ttl.Milliseconds())
	raw, err := reserveScript.Run(ctx, l.rdb, keys, args...).Slice()
	if err != nil {
		return Decision{}, fmt.Errorf("reserve rate limits for %s: %w", reservationID, err)
	}
	n := len(buckets)
	if len(raw) != 3+2*n {
		return Decision{}, fmt.Errorf("reserve rate limits for %s: reply of %d values, want %d", reservationID, len(raw), 3+2*n)
	}
	d := Decision{Status: Status(toInt(raw[0])), Remaining: make([]float64, n), ResetAfter: make([]time.Duration, n)}
	if i := int(toInt(raw[1])); i >= 1 && i <= n {
		b := buckets[i-1]
		d.Bucket = &b
	}
	d.RetryAfter = seconds(toFloat(raw[2]))
	for i := 0; i < n; i++ {
		d.Remaining[i] = toFloat(raw[3+i])
		d.ResetAfter[i] = seconds(toFloat(raw[3+n+i]))
	}
	return d, nil
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

func formatFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

func seconds(s float64) time.Duration {
	if s <= 0 || math.IsNaN(s) {
		return 0
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	case int64:
		return float64(x)
	}
	return 0
}
