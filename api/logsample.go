package api

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/tracing"
)

// logEvery spaces the log lines about one kind of refusal (connections
// over a cap; requests of one tenant refused for one reason): a flood of
// refusals must not become a flood of log lines too.
const logEvery = 10 * time.Second

// maxSampledKeys bounds the kinds a logSampler remembers; past it, its
// memory is cleared (at worst a few extra lines).
const maxSampledKeys = 10_000

// logSampler decides which events of a kind get a log line: the first at
// once, then at most one every logEvery, each told how many of its kind
// went without a line since the one before. What happened after the last
// line is told by the next one, or only by the metrics if none comes.
type logSampler struct {
	now func() time.Time

	mu   sync.Mutex
	seen map[string]*sampleWindow
}

type sampleWindow struct {
	logged  time.Time
	skipped int
}

func newLogSampler() *logSampler {
	return &logSampler{now: time.Now, seen: map[string]*sampleWindow{}}
}

// allow reports whether an event of kind gets its line now, and how many
// of its kind got none since the last line.
func (s *logSampler) allow(kind string) (skipped int, ok bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.seen[kind]
	if w == nil {
		if len(s.seen) >= maxSampledKeys {
			clear(s.seen)
		}
		w = &sampleWindow{}
		s.seen[kind] = w
	}
	if !w.logged.IsZero() && now.Sub(w.logged) < logEvery {
		w.skipped++
		return 0, false
	}
	skipped, w.logged, w.skipped = w.skipped, now, 0
	return skipped, true
}

// logRefusal writes the "request finished" line of a request the door
// refused before any workflow (429 rate_limited, 503 queue_full,
// tenant_queue_full, busy, unavailable), sampled per tenant and reason:
// the line carries how many more were refused meanwhile
// (request.Finished.Similar).
func (s *Server) logRefusal(ctx context.Context, d door, reason string) {
	similar, ok := s.refusals.allow(d.who.Tenant + "\x00" + reason)
	if !ok {
		return
	}
	request.Finished{
		RequestID: d.id, Tenant: d.who.Tenant, Route: d.pool, Outcome: request.OutcomeRejected, Reason: reason,
		TraceID: tracing.TraceID(ctx), Similar: similar,
	}.Log(ctx, s.logger)
}
