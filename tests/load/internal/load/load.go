// Package load drives requests at a system and tallies their latencies:
// closed loops of clients, and open loops paced at a fixed rate.
package load

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/stats"
)

// Result is what a run of requests measured.
type Result struct {
	Sent    int
	Elapsed time.Duration
	// Lat is each answered request's latency. In an open loop it runs
	// from the request's scheduled start if its worker was still busy
	// with an earlier request then (the system made it wait: no
	// coordinated omission), else from when it was sent (the generator's
	// own timer slack is not the system's latency).
	Lat stats.Latencies
	// Late counts requests of an open loop sent more than a millisecond
	// after their scheduled time because their worker was busy.
	Late int
	Errs int
}

// Rate is the requests answered without an error per second.
func (r Result) Rate() float64 { return float64(len(r.Lat)) / r.Elapsed.Seconds() }

// SentRate is the requests sent per second.
func (r Result) SentRate() float64 { return float64(r.Sent) / r.Elapsed.Seconds() }

// ClosedLoop runs clients that each send their next request as soon as
// the previous one returned, for d. do is called with the client's index.
func ClosedLoop(ctx context.Context, d time.Duration, clients int, do func(ctx context.Context, client int) error) Result {
	start := time.Now()
	deadline := start.Add(d)
	return runWorkers(start, clients, func(c int) (t tally) {
		t.lat = make([]time.Duration, 0, 4096)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			t0 := time.Now()
			if err := do(ctx, c); err != nil {
				t.errs++
				continue
			}
			t.lat = append(t.lat, time.Since(t0))
		}
		return t
	})
}

// tally is what one worker of a load measured.
type tally struct {
	lat        []time.Duration
	late, errs int
}

// runWorkers runs work on n goroutines and adds up their tallies; the
// load's time runs from start until the last worker returned.
func runWorkers(start time.Time, n int, work func(w int) tally) Result {
	var mu sync.Mutex
	var res Result
	var all []time.Duration
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			t := work(w)
			mu.Lock()
			all = append(all, t.lat...)
			res.Late += t.late
			res.Errs += t.errs
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.Sent = len(all) + res.Errs
	res.Lat = stats.Sorted(all)
	return res
}

// Feed sends 0 to n-1 on the channel it returns, then closes it; it
// stops early when ctx is done.
func Feed(ctx context.Context, n int) <-chan int {
	ch := make(chan int)
	go func() {
		defer close(ch)
		for i := 0; i < n; i++ {
			select {
			case ch <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// Paced issues requests at a fixed total rate for d, open loop: request i
// is due at start + i/rate whatever happened to earlier ones, spread over
// workers that each own every workers-th request. do is called with the
// worker's index.
func Paced(ctx context.Context, rate float64, d time.Duration, workers int, do func(ctx context.Context, worker, i int) error) Result {
	total := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now().Add(50 * time.Millisecond)
	return runWorkers(start, workers, func(w int) (t tally) {
		t.lat = make([]time.Duration, 0, total/workers+1)
		var prevDone time.Time
		for i := w; i < total && ctx.Err() == nil; i += workers {
			due := start.Add(time.Duration(i) * interval)
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
			sent := time.Now()
			err := do(ctx, w, i)
			done := time.Now()
			from := sent
			if prevDone.After(due) {
				from = due
				if sent.Sub(due) > time.Millisecond {
					t.late++
				}
			}
			prevDone = done
			if err != nil {
				t.errs++
				continue
			}
			t.lat = append(t.lat, done.Sub(from))
		}
		return t
	})
}

// SleepUntil waits until t; false if ctx ended first.
func SleepUntil(ctx context.Context, t time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(t)):
		return ctx.Err() == nil
	}
}
