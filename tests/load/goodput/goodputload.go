package goodput

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/load"
	"github.com/sluice-dev/sluice/tests/load/internal/machine"
)

// The goodput scenario's load: one step is one system under one load,
// closed loop (a fixed number of clients, each sending its next request
// as soon as the last one ended) or open loop (Poisson arrivals at a
// fixed rate, whatever happened to earlier ones). A step sends for its
// warm-up, then for its window; only the requests that ended within the
// window count, so that its rates are those of the steady state. After
// the window no request is started, and the ones in flight are awaited.

// attempt is one request as its client saw it, when it ended, and how
// long it took from the send to its end (an answer's answer time).
type attempt struct {
	chat.Result
	end  time.Time
	took time.Duration
}

// requester sends the i-th request of a step and reads it to its end.
type requester func(ctx context.Context, i int) chat.Result

// stepRun is one step's load while it runs.
type stepRun struct {
	label            string
	start            time.Time
	winStart, winEnd time.Time
	// timeout bounds each request, as a client's patience.
	timeout time.Duration

	mu    sync.Mutex
	ended []attempt // the requests that ended within the window
	// Open loop: arrivals within the window, and those not sent because
	// the in-flight cap was reached.
	arrivals, shed int

	inFlight atomic.Int64
	done     atomic.Int64 // done within the window so far
}

func newStepRun(label string, warmup, window, timeout time.Duration) *stepRun {
	start := time.Now()
	return &stepRun{label: label, start: start, winStart: start.Add(warmup), winEnd: start.Add(warmup + window), timeout: timeout}
}

// call sends one request whose in-flight count the caller already took,
// and keeps it if it ended within the window.
func (r *stepRun) call(ctx context.Context, do requester, i int) {
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	sent := time.Now()
	res := do(cctx, i)
	cancel()
	end := time.Now()
	r.inFlight.Add(-1)
	if end.Before(r.winStart) || end.After(r.winEnd) {
		return
	}
	r.mu.Lock()
	r.ended = append(r.ended, attempt{Result: res, end: end, took: end.Sub(sent)})
	r.mu.Unlock()
	if res.Kind == chat.KindDone {
		r.done.Add(1)
	}
}

// closedLoop runs clients that each send their next request as soon as
// the last one ended, until the window is over.
func (r *stepRun) closedLoop(ctx context.Context, clients int, do requester) {
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; time.Now().Before(r.winEnd) && ctx.Err() == nil; i += clients {
				r.inFlight.Add(1)
				r.call(ctx, do, i)
			}
		}()
	}
	wg.Wait()
}

// openLoop sends requests at Poisson arrivals of rate per second until
// the window is over, never more than maxInFlight at once: an arrival
// beyond that is shed by the client, as a load balancer in front would.
func (r *stepRun) openLoop(ctx context.Context, rate float64, maxInFlight int, seed uint64, do requester) {
	rng := rand.New(rand.NewPCG(seed, seed))
	var wg sync.WaitGroup
	at := r.start
	for i := 0; ; i++ {
		at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if !at.Before(r.winEnd) || !load.SleepUntil(ctx, at) {
			break
		}
		inWindow := !at.Before(r.winStart)
		if r.inFlight.Load() >= int64(maxInFlight) {
			if inWindow {
				r.mu.Lock()
				r.arrivals++
				r.shed++
				r.mu.Unlock()
			}
			continue
		}
		if inWindow {
			r.mu.Lock()
			r.arrivals++
			r.mu.Unlock()
		}
		r.inFlight.Add(1)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r.call(ctx, do, i)
		}(i)
	}
	wg.Wait()
}

// status is the step's progress line: its phase, how far into it, and
// what it has done so far.
func (r *stepRun) status() string {
	phase := "warm-up"
	switch now := time.Now(); {
	case now.After(r.winEnd):
		phase = "draining"
	case now.After(r.winStart):
		phase = "measuring"
	}
	r.mu.Lock()
	arrivals, shed := r.arrivals, r.shed
	r.mu.Unlock()
	s := fmt.Sprintf("step=%q phase=%s at=%.0fs/%.0fs answered_in_window=%d in_flight=%d",
		r.label, phase, time.Since(r.start).Seconds(), r.winEnd.Sub(r.start).Seconds(), r.done.Load(), r.inFlight.Load())
	if arrivals > 0 {
		s += fmt.Sprintf(" offered_in_window=%d shed=%d", arrivals, shed)
	}
	return s
}

// windowCPU is where CPU went within a step's window, in CPU-seconds.
type windowCPU struct {
	// temporal is the dev server's; others is every process's outside
	// this process tree (other work on the machine, which the figures
	// of a shared machine must be read against).
	temporal, others float64
}

// cpuInWindow measures the step's window's CPU; the channel gets it once
// the window is over.
func (r *stepRun) cpuInWindow(ctx context.Context) <-chan windowCPU {
	out := make(chan windowCPU, 1)
	go func() {
		defer close(out)
		if !load.SleepUntil(ctx, r.winStart) {
			return
		}
		c0 := machine.TakeCPU()
		if !load.SleepUntil(ctx, r.winEnd) {
			return
		}
		c1 := machine.TakeCPU()
		tree := c1.Self - c0.Self
		for name, sec := range c1.Children {
			tree += sec - c0.Children[name]
		}
		out <- windowCPU{temporal: c1.Children[temporalComm] - c0.Children[temporalComm], others: max(0, c1.Machine-c0.Machine-tree)}
	}()
	return out
}

// temporalComm is the dev server's process name (the CLI's binary, a
// child of this process).
const temporalComm = "temporal"
