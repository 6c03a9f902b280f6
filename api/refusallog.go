package api

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
)

// refusalLogEvery is how often the door logs refusals of one tenant for
// one reason: a flood of 429s must not become a flood of log lines too.
const refusalLogEvery = 10 * time.Second

// maxRefusalKeys bounds the tenants × reasons remembered; past it, the
// memory is cleared (at worst a few extra lines).
const maxRefusalKeys = 10_000

// refusalLog writes the "request finished" line of requests refused at
// the door before any workflow (429 rate_limited, 503 queue_full,
// tenant_queue_full, busy, unavailable): the first of a tenant and reason
// at once, the next ones at most once a window, carrying how many were
// refused meanwhile without a line (request.Finished.Similar). The
// refusals of the last window are told by the next line, or only by the
// metrics (sluice_requests_total) if none comes.
type refusalLog struct {
	logger *slog.Logger
	every  time.Duration
	now    func() time.Time

	mu   sync.Mutex
	seen map[refusalKey]*refusalWindow
}

type refusalKey struct{ tenant, reason string }

type refusalWindow struct {
	logged  time.Time
	similar int
}

func newRefusalLog(logger *slog.Logger) *refusalLog {
	return &refusalLog{logger: logger, every: refusalLogEvery, now: time.Now, seen: map[refusalKey]*refusalWindow{}}
}

// note logs f, a refused request's line, or counts it toward the next.
func (l *refusalLog) note(ctx context.Context, f request.Finished) {
	k := refusalKey{f.Tenant, f.Reason}
	now := l.now()
	l.mu.Lock()
	w := l.seen[k]
	if w == nil {
		if len(l.seen) >= maxRefusalKeys {
			clear(l.seen)
		}
		w = &refusalWindow{}
		l.seen[k] = w
	}
	if !w.logged.IsZero() && now.Sub(w.logged) < l.every {
		w.similar++
		l.mu.Unlock()
		return
	}
	f.Similar, w.logged, w.similar = w.similar, now, 0
	l.mu.Unlock()
	f.Log(ctx, l.logger)
}
