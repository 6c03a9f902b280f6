package door

import (
	"math"
	"time"

	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/limiter"
)

// Standing is what a client is told of where it stands, whatever the door
// decided: the rate-limit bucket of each kind with the least left, its
// tenant's month against its budget, and whether the answer follows an
// earlier request with the same Idempotency-Key. A transport renders it
// (api/httpio as the X-RateLimit-*, X-Budget-* and Idempotent-Replayed
// headers).
type Standing struct {
	// Tokens and Requests are the most constraining bucket of each kind;
	// nil when no limit of that kind applied.
	Tokens, Requests *Bucket
	// Month is the tenant's monthly budget; nil when its tier has none.
	Month *Month
	// Replayed: the answer follows the request an earlier POST with the
	// same Idempotency-Key started.
	Replayed bool
}

// Bucket is one rate-limit bucket as a client hears of it.
type Bucket struct {
	// Limit is what the bucket holds when full; Remaining what is left
	// (never below 0, in whole units).
	Limit, Remaining float64
	// ResetAfter is the time until it is full again.
	ResetAfter time.Duration
}

// Month is a tenant's monthly budget as a client hears of it: zero
// limits are no limit of that kind.
type Month struct {
	Tokens, TokensLeft     int64
	SpendUSD, SpendLeftUSD float64
	Resets                 time.Time
}

// noteRates records, per kind, the bucket with the least left.
func (s *Standing) noteRates(buckets []limiter.Bucket, d limiter.Decision) {
	for _, kind := range []limiter.Kind{limiter.Tokens, limiter.Requests} {
		best := -1
		for i, b := range buckets {
			if b.Kind == kind && (best < 0 || d.Remaining[i] < d.Remaining[best]) {
				best = i
			}
		}
		if best < 0 {
			continue
		}
		b := &Bucket{Limit: buckets[best].Capacity, Remaining: math.Max(0, math.Floor(d.Remaining[best])), ResetAfter: d.ResetAfter[best]}
		if kind == limiter.Tokens {
			s.Tokens = b
		} else {
			s.Requests = b
		}
	}
}

// noteMonth records the tenant's month as the budget counter decided it.
func (s *Standing) noteMonth(dec budget.Decision) {
	m := &Month{Resets: dec.ResetsAt}
	if dec.Limit.Tokens > 0 {
		m.Tokens, m.TokensLeft = dec.Limit.Tokens, max(0, dec.Limit.Tokens-dec.Used.Tokens)
	}
	if dec.Limit.Micros > 0 {
		m.SpendUSD, m.SpendLeftUSD = budget.USD(dec.Limit.Micros), budget.USD(max(0, dec.Limit.Micros-dec.Used.Micros))
	}
	s.Month = m
}
