package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HealingAlert counts an alert of the healer about pool at level.
func (m *Metrics) HealingAlert(pool, level string) {
	if m == nil {
		return
	}
	m.alerts.WithLabelValues(pool, level).Inc()
}

// HealingAction counts an action of the healer applied to pool through
// this instance (set_permits, set_batch, throttle_long, scale, shed).
func (m *Metrics) HealingAction(pool, action string) {
	if m == nil {
		return
	}
	m.actions.WithLabelValues(pool, action).Inc()
}

// HealingLevel reports the healer's level of pool (0 normal … 4 shed) as
// this instance last heard it, for fresh: the healer runs its activities
// on any worker, so an instance that has not heard for that long drops
// the series rather than repeat an old level, and the freshest instances
// are the ones a dashboard sees.
func (m *Metrics) HealingLevel(pool string, level int, fresh time.Duration) {
	if m == nil {
		return
	}
	m.healing.set(pool, level, fresh)
}

var healingLevelDesc = prometheus.NewDesc("sluice_healing_level",
	"The healer's level of each pool: 0 normal, 1 shrink, 2 throttle long, 3 scale, 4 shed; reported by the instances that heard it within the last few polls.",
	[]string{"pool"}, nil)

type healingLevels struct {
	now    func() time.Time
	mu     sync.Mutex
	levels map[string]heardLevel
}

type heardLevel struct {
	level int
	until time.Time
}

func newHealingLevels() *healingLevels {
	return &healingLevels{now: time.Now, levels: map[string]heardLevel{}}
}

func (h *healingLevels) set(pool string, level int, fresh time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.levels[pool] = heardLevel{level: level, until: h.now().Add(fresh)}
}

func (h *healingLevels) Describe(ch chan<- *prometheus.Desc) { ch <- healingLevelDesc }

func (h *healingLevels) Collect(ch chan<- prometheus.Metric) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	for pool, l := range h.levels {
		if now.After(l.until) {
			delete(h.levels, pool)
			continue
		}
		ch <- prometheus.MustNewConstMetric(healingLevelDesc, prometheus.GaugeValue, float64(l.level), pool)
	}
}
