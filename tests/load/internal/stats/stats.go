package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// msFine is ms with the precision sub-millisecond latencies need.
func msFine(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond))
}

// latencies is a sorted sample of durations.
type latencies []time.Duration

func sorted(ds []time.Duration) latencies {
	s := append(latencies(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

// at is the p-th percentile (0 < p <= 100) by the nearest-rank method.
func (l latencies) at(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	idx := int(float64(len(l))*p/100+0.999999) - 1
	idx = max(0, min(idx, len(l)-1))
	return l[idx]
}

func (l latencies) max() time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[len(l)-1]
}

// perSecond formats a rate with thousands separators.
func perSecond(n float64) string { return thousands(int64(n+0.5)) + "/s" }

func thousands(n int64) string {
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

func mib(bytes float64) string { return fmt.Sprintf("%.0f MiB", bytes/(1<<20)) }

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func durOrDash(l latencies, p float64) string {
	if len(l) == 0 {
		return "—"
	}
	return ms(l.at(p))
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
