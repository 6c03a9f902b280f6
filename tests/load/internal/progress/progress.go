// Package progress prints a running scenario's progress lines: a
// scenario runs for minutes, and someone watching it (or a CI log) must
// see that it is alive and how far it got. Every scenario prints a line
// on stderr at least every Every, built by a function that reads what
// the scenario has at hand; the report on stdout stays clean.
package progress

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Every is how often a running scenario prints its progress.
const Every = 5 * time.Second

// Ticker prints "[name] 35s <line()>" to w every interval until
// stopped.
type Ticker struct {
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// Start starts a ticker; line is called from the ticker's own
// goroutine, so it must read only what is safe to read concurrently.
func Start(w io.Writer, name string, interval time.Duration, line func() string) *Ticker {
	p := &Ticker{stop: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(p.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			fmt.Fprintf(w, "[%s] %.0fs %s\n", name, time.Since(start).Seconds(), line())
		}
	}()
	return p
}

// Stop ends the ticker and waits for a line being printed: nothing is
// printed once it returns. It may be called more than once.
func (p *Ticker) Stop() {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
}

// Meter is what a scenario's current phase has done so far, for its
// progress line: the phase's name, when it began, and a count of what it
// finished (requests, decisions, rounds), out of how many if known.
// Safe for concurrent use.
type Meter struct {
	mu    sync.Mutex
	phase string
	since time.Time
	total int64
	n     atomic.Int64
	errs  atomic.Int64
}

// Enter starts a phase, its counts from zero; total is 0 when unknown,
// and negative when the phase's work is not counted here (a child
// process's, say).
func (m *Meter) Enter(phase string, total int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.phase, m.since, m.total = phase, time.Now(), total
	m.n.Store(0)
	m.errs.Store(0)
}

// Current is the phase's name.
func (m *Meter) Current() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.phase
}

// Add counts n things done, fail one that failed.
func (m *Meter) Add(n int64) { m.n.Add(n) }
func (m *Meter) Fail()       { m.errs.Add(1) }

// String is "phase=… for=…s[ done=n[/total] rate=…/s][ errors=…]".
func (m *Meter) String() string {
	m.mu.Lock()
	phase, since, total := m.phase, m.since, m.total
	m.mu.Unlock()
	if phase == "" {
		return "phase=starting"
	}
	in := time.Since(since).Seconds()
	s := fmt.Sprintf("phase=%s for=%.0fs", phase, in)
	if total < 0 {
		return s
	}
	n := m.n.Load()
	done := fmt.Sprint(n)
	if total > 0 {
		done += fmt.Sprintf("/%d", total)
	}
	s += fmt.Sprintf(" done=%s rate=%.1f/s", done, float64(n)/max(in, 1e-3))
	if e := m.errs.Load(); e > 0 {
		s += fmt.Sprintf(" errors=%d", e)
	}
	return s
}
