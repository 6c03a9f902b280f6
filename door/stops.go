package door

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
)

// stopWatch looks at the stop flags (DELETE, raised on any instance) of
// every request waiting in this door's room in one round trip per poll.
// A look per waiter would cost the waiting room a round trip per waiter
// and poll, which under a backlog of thousands is most of what the
// process does. It polls only while someone waits.
type stopWatch struct {
	events *events.Log
	every  time.Duration
	// timeout bounds one look (redis.request_timeout).
	timeout time.Duration
	logger  *slog.Logger

	mu      sync.Mutex
	watched map[string]chan struct{}
	polling bool
}

func newStopWatch(log *events.Log, every, timeout time.Duration, logger *slog.Logger) *stopWatch {
	return &stopWatch{events: log, every: every, timeout: timeout, logger: logger, watched: map[string]chan struct{}{}}
}

// watch returns a channel closed when id's stop flag is seen raised, and
// the function that stops watching it.
func (s *stopWatch) watch(id string) (<-chan struct{}, func()) {
	stopped := make(chan struct{})
	s.mu.Lock()
	s.watched[id] = stopped
	if !s.polling {
		s.polling = true
		go s.poll()
	}
	s.mu.Unlock()
	return stopped, func() {
		s.mu.Lock()
		if s.watched[id] == stopped {
			delete(s.watched, id)
		}
		s.mu.Unlock()
	}
}

// poll looks every s.every until nobody is watched.
func (s *stopWatch) poll() {
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for range tick.C {
		ids := s.ids()
		if len(ids) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		stopped, err := s.events.StoppedAmong(ctx, ids)
		cancel()
		if err != nil {
			// The next look may find Redis back; until then a stop waits.
			s.logger.Warn("read the stop flags of the door's waiters", "waiters", len(ids), "err", err)
			continue
		}
		s.signal(ids, stopped)
	}
}

// ids lists the watched requests; with none it ends polling, under the
// same lock as watch starts it, so that a watch is never left unpolled.
func (s *stopWatch) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.watched) == 0 {
		s.polling = false
		return nil
	}
	ids := make([]string, 0, len(s.watched))
	for id := range s.watched {
		ids = append(ids, id)
	}
	return ids
}

// signal closes the channels of the stopped requests and stops watching
// them.
func (s *stopWatch) signal(ids []string, stopped []bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, id := range ids {
		if !stopped[i] {
			continue
		}
		if ch, ok := s.watched[id]; ok {
			close(ch)
			delete(s.watched, id)
		}
	}
}
