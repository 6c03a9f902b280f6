package latency

import (
	"math"
	"math/bits"
	"time"
)

// The histogram's buckets grow by a constant ratio, so that any quantile
// read from them is within RelativeError of the exact value at its rank
// (the scheme of DDSketch): bucket i ≥ 1 holds (Min·γ^(i-1), Min·γ^i] and
// is reported as 2·Min·γ^i/(γ+1), which is at most RelativeError away from
// any value in it. γ = (1+α)/(1-α) with α = 5% takes 157 buckets to span
// 100 µs to 10 min, at most 1.3 KB per series and slot in Redis.
const (
	// RelativeError bounds a quantile's error for latencies between Min
	// and Max.
	RelativeError = 0.05
	// Min is the smallest latency told apart: anything at or below it
	// is reported as Min.
	Min = 100 * time.Microsecond
	// Max is the largest: anything above it is counted in the top bucket,
	// reported as about Max.
	Max = 10 * time.Minute

	numBuckets = 157
)

var (
	gamma = (1 + RelativeError) / (1 - RelativeError)

	// bucketValue is what a bucket reports for the values in it.
	bucketValue [numBuckets]time.Duration
	// bucketTop is the largest latency in a bucket (ns, floored: a
	// latency is a whole number of ns, so d ≤ bucketTop[i] exactly when d
	// ≤ Min·γ^i).
	bucketTop [numBuckets]int64
	// firstBucket is, per bit length of a latency in ns, the first bucket
	// that can hold it: a latency's bucket is then a few comparisons
	// away (an octave spans under seven buckets), several times faster
	// than a logarithm on the hot path.
	firstBucket [65]uint8
)

func init() {
	for i := range numBuckets {
		top := float64(Min) * math.Pow(gamma, float64(i))
		bucketTop[i] = int64(top)
		bucketValue[i] = time.Duration(2 * top / (gamma + 1))
	}
	bucketValue[0] = Min
	bucketTop[numBuckets-1] = math.MaxInt64
	for b := range firstBucket {
		// The smallest latency of bit length b is 2^(b-1).
		smallest := int64(1) << max(b-1, 0)
		if b == 64 {
			smallest = math.MaxInt64
		}
		i := 0
		for bucketTop[i] < smallest {
			i++
		}
		firstBucket[b] = uint8(i)
	}
}

// bucketOf is the bucket holding latency d.
func bucketOf(d time.Duration) int {
	v := max(int64(d), 0)
	i := int(firstBucket[bits.Len64(uint64(v))])
	for v > bucketTop[i] {
		i++
	}
	return i
}

// Stats is what a series recorded over a window, from every process.
type Stats struct {
	// Count is the number of latencies recorded.
	Count int64
	// Sum is their total, to the microsecond (it is exact, not read from
	// the buckets).
	Sum time.Duration
	// P50, P90 and P99 are quantiles, within RelativeError of the exact
	// value at their rank. Zero when Count is 0.
	P50, P90, P99 time.Duration
	// Added is the sum of the Add calls.
	Added int64
	// Span is the time the merged slots cover: from the start of the
	// oldest slot read to now, on Redis's clock. It is at least the window
	// asked for and at most one slot more; divide counts by it for rates.
	Span time.Duration

	hist []int64
}

// Mean is Sum / Count; zero when Count is 0.
func (s Stats) Mean() time.Duration {
	if s.Count == 0 {
		return 0
	}
	return s.Sum / time.Duration(s.Count)
}

// TailRatio is P99 / P50, the tail signal (above 2 warn, above 5
// critical, above 10 collapse: a healthy stage's tail is within twice its
// median); zero when Count is 0. P99 and P50 are each within
// RelativeError, so the ratio is within about twice that (±10.5%). Below
// about a hundred latencies P99 is one or two of them, and the ratio is
// noise.
func (s Stats) TailRatio() float64 {
	if s.P50 == 0 {
		return 0
	}
	return float64(s.P99) / float64(s.P50)
}

// Quantile is the latency at quantile q (0 ≤ q ≤ 1): the ⌈q·Count⌉-th
// smallest (the smallest when that is 0), within RelativeError. Zero when
// Count is 0.
func (s Stats) Quantile(q float64) time.Duration {
	if s.Count == 0 {
		return 0
	}
	rank := max(int64(math.Ceil(q*float64(s.Count))), 1)
	var seen int64
	for i, n := range s.hist {
		seen += n
		if seen >= rank {
			return bucketValue[i]
		}
	}
	return bucketValue[len(s.hist)-1]
}
