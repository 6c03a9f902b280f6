// Package stats sorts durations into percentiles and formats the
// figures the reports print.
package stats

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

func Ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// MsFine is Ms with the precision sub-millisecond latencies need.
func MsFine(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond))
}

// Latencies is a sorted sample of durations.
type Latencies []time.Duration

func Sorted(ds []time.Duration) Latencies {
	s := append(Latencies(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

// At is the p-th percentile (0 < p <= 100) by the nearest-rank method.
func (l Latencies) At(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	idx := int(float64(len(l))*p/100+0.999999) - 1
	idx = max(0, min(idx, len(l)-1))
	return l[idx]
}

func (l Latencies) Max() time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[len(l)-1]
}

// PerSecond formats a rate with thousands separators.
func PerSecond(n float64) string { return Thousands(int64(n+0.5)) + "/s" }

func Thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func MiB(bytes float64) string { return fmt.Sprintf("%.0f MiB", bytes/(1<<20)) }

func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func DurOrDash(l Latencies, p float64) string {
	if len(l) == 0 {
		return "—"
	}
	return Ms(l.At(p))
}

func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
