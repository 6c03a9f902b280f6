// Package logsample decides which of many similar events get a log line:
// a flood of refusals (connections over a cap, requests of one tenant
// refused for one reason) must not become a flood of log lines too.
package logsample

import (
	"sync"
	"time"
)

// Every spaces the log lines about one kind of event.
const Every = 10 * time.Second

// maxKinds bounds the kinds a Sampler remembers; past it, its memory is
// cleared (at worst a few extra lines).
const maxKinds = 10_000

// Sampler gives an event of a kind its line at once, then at most one
// every Every, each told how many of its kind went without a line since
// the one before. What happened after the last line is told by the next
// one, or only by the metrics if none comes.
type Sampler struct {
	// Now is the clock; tests replace it.
	Now func() time.Time

	mu   sync.Mutex
	seen map[string]*window
}

type window struct {
	logged  time.Time
	skipped int
}

// New is a Sampler on the wall clock.
func New() *Sampler { return &Sampler{Now: time.Now, seen: map[string]*window{}} }

// Allow reports whether an event of kind gets its line now, and how many
// of its kind got none since the last line.
func (s *Sampler) Allow(kind string) (skipped int, ok bool) {
	now := s.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.seen[kind]
	if w == nil {
		if len(s.seen) >= maxKinds {
			clear(s.seen)
		}
		w = &window{}
		s.seen[kind] = w
	}
	if !w.logged.IsZero() && now.Sub(w.logged) < Every {
		w.skipped++
		return 0, false
	}
	skipped, w.logged, w.skipped = w.skipped, now, 0
	return skipped, true
}
