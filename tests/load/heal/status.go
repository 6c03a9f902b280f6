package heal

import (
	"fmt"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
)

// healLive is the mode running now, as its progress line tells it: the
// requests sent, ended and answered, and the latest sample of the pools.
// Safe for concurrent use.
type healLive struct {
	mu                       sync.Mutex
	mode                     string
	start                    time.Time
	sentN, endedN, answeredN int
	last                     *healSample
}

// begin starts a mode from zero.
func (l *healLive) begin(mode string, start time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mode, l.start = mode, start
	l.sentN, l.endedN, l.answeredN, l.last = 0, 0, 0, nil
}

func (l *healLive) sent() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sentN++
}

// ended counts a request that ended with an outcome of kind.
func (l *healLive) ended(kind string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endedN++
	if kind == chat.KindDone {
		l.answeredN++
	}
}

// sampled keeps the latest sample; its maps are not written after.
func (l *healLive) sampled(s healSample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = &s
}

// Status is the mode's progress line: the load so far, the latest
// sample of the short pool's tail, the healer's levels, and the
// simulator and the gate as they are now.
func (h *healScenario) Status(st *stack.Stack) string {
	l := &h.live
	l.mu.Lock()
	mode, start, sent, ended, answered, last := l.mode, l.start, l.sentN, l.endedN, l.answeredN, l.last
	l.mu.Unlock()
	if mode == "" {
		return "phase=starting"
	}
	s := fmt.Sprintf("phase=healing-%s t=%.0fs/%.0fs offered=%d answered=%d in_flight=%d",
		mode, time.Since(start).Seconds(), h.duration.Seconds(), sent, answered, sent-ended)
	if last != nil {
		sh := last.Pools[request.PoolShort]
		s += fmt.Sprintf(" short_p50=%.0fms short_p99=%.0fms short_ratio=%.1f n=%d long_ratio=%.1f levels=short:%d,long:%d polls=%d",
			stats.Millis(sh.P50), stats.Millis(sh.P99), sh.TailRatio(), sh.Count, last.Pools[request.PoolLong].TailRatio(),
			last.Levels[request.PoolShort], last.Levels[request.PoolLong], last.Polls)
	}
	sim := st.Sim.Stats()
	return s + fmt.Sprintf(" sim_running=%d sim_waiting=%d kv=%.0f%% replicas=%d %s",
		sim.Running, sim.Waiting, 100*sim.CacheUsage, sim.ActiveReplicas, st.PoolsNow())
}
