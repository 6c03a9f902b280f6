package latency

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// BenchmarkRecord is the hot path: one latency into a series already seen.
func BenchmarkRecord(b *testing.B) {
	w := newWindow(b, srv.Client(b), nil, Options{})
	series := Series("llm_first_token", "short")
	b.ReportAllocs()
	d := 37 * time.Millisecond
	for b.Loop() {
		w.Record(series, d)
	}
}

// BenchmarkRecordParallel records from every core into twelve series
// (six stages, two pools), as a busy worker would.
func BenchmarkRecordParallel(b *testing.B) {
	w := newWindow(b, srv.Client(b), nil, Options{})
	series := benchSeries()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			w.Record(series[i%len(series)], time.Duration(i%4000)*time.Millisecond)
			i++
		}
	})
}

func benchSeries() []string {
	var series []string
	for _, stage := range []string{"embed", "retrieval", "rerank", "queue_wait", "llm_first_token", "llm_total"} {
		for _, pool := range []string{"short", "long"} {
			series = append(series, Series(stage, pool))
		}
	}
	return series
}

// fill records n latencies spread over two orders of magnitude (about 50
// buckets) into every series.
func fill(w *Window, series []string, n int, rng *rand.Rand) {
	for _, s := range series {
		for range n {
			w.Record(s, time.Duration(float64(10*time.Millisecond)*(1+99*rng.Float64())))
		}
	}
}

// BenchmarkFlush is one process's flush of a second: twelve series of 20
// latencies each (a few dozen requests a second) or 200 (a busy worker,
// about 50 buckets per series), and two counters.
func BenchmarkFlush(b *testing.B) {
	for _, n := range []int{20, 200} {
		b.Run("latencies="+strconv.Itoa(n), func(b *testing.B) {
			rdb := srv.Client(b)
			w := newWindow(b, rdb, nil, Options{})
			series := benchSeries()
			rng := rand.New(rand.NewPCG(1, 1))
			ctx := context.Background()
			testenv.ResetServerStats(b, rdb)
			for b.Loop() {
				b.StopTimer()
				fill(w, series, n, rng)
				w.Add(Series("llm_requests", "short"), int64(n))
				w.Add(Series("llm_timeout", "short"), 3)
				b.StartTimer()
				if err := w.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			}
			testenv.ReportScriptTime(b, rdb)
		})
	}
}

// BenchmarkSnapshot reads a minute of one series (seven 10 s slots, each
// written by three processes, about 50 buckets each), then of the three
// series a healer reads per pool.
func BenchmarkSnapshot(b *testing.B) {
	rdb := srv.Client(b)
	clock := newTestClock()
	prefix := fmt.Sprintf("bench:%d:", time.Now().UnixNano())
	series := []string{Series("llm_first_token", "short"), Series("llm_requests", "short"), Series("llm_timeout", "short")}
	rng := rand.New(rand.NewPCG(2, 2))
	var w *Window
	for range 3 {
		w = newWindow(b, rdb, clock, Options{KeyPrefix: prefix})
		for range 7 {
			fill(w, series[:1], 1000, rng)
			w.Add(series[1], 1000)
			w.Add(series[2], 20)
			if err := w.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
			clock.Advance(10 * time.Second)
		}
		clock.Advance(-70 * time.Second)
	}
	clock.Advance(69 * time.Second)
	for _, n := range []int{1, 3} {
		b.Run("series="+strconv.Itoa(n), func(b *testing.B) {
			ctx := context.Background()
			testenv.ResetServerStats(b, rdb)
			b.ReportAllocs()
			for b.Loop() {
				s, err := w.Snapshots(ctx, time.Minute, series[:n]...)
				if err != nil || s[0].Count != 21_000 {
					b.Fatalf("%+v %v", s[0], err)
				}
			}
			testenv.ReportScriptTime(b, rdb)
		})
	}
}
