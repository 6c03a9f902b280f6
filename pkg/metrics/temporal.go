package metrics

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
)

// TemporalHandler exports the Temporal SDK's metrics (workflow task and
// activity latencies, poller counts, sticky cache use …) into the registry,
// named temporal_<name>.
//
// Prometheus wants one label set per metric name, while the SDK tags a
// metric at several call sites: the first use of a name fixes its label
// names; later uses fill labels they lack with "" and drop labels the
// first did not have.
func (m *Metrics) TemporalHandler() client.MetricsHandler {
	if m == nil {
		return client.MetricsNopHandler
	}
	return &temporalHandler{shared: &temporalVecs{reg: m.reg, vecs: map[string]*temporalVec{}}}
}

type temporalVecs struct {
	reg  *prometheus.Registry
	mu   sync.Mutex
	vecs map[string]*temporalVec
}

// temporalVec is one SDK metric name: its kind and fixed label names.
type temporalVec struct {
	labels  []string
	counter *prometheus.CounterVec
	gauge   *prometheus.GaugeVec
	timer   *prometheus.HistogramVec
}

type temporalHandler struct {
	shared *temporalVecs
	tags   map[string]string
}

func (h *temporalHandler) WithTags(tags map[string]string) client.MetricsHandler {
	merged := maps.Clone(h.tags)
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, tags)
	return &temporalHandler{shared: h.shared, tags: merged}
}

func (h *temporalHandler) Counter(name string) client.MetricsCounter {
	v := h.shared.vec(name, "counter", h.tags)
	if v.counter == nil {
		return client.MetricsNopHandler.Counter(name)
	}
	c := v.counter.WithLabelValues(v.values(h.tags)...)
	return counterFunc(func(d int64) { c.Add(float64(d)) })
}

func (h *temporalHandler) Gauge(name string) client.MetricsGauge {
	v := h.shared.vec(name, "gauge", h.tags)
	if v.gauge == nil {
		return client.MetricsNopHandler.Gauge(name)
	}
	g := v.gauge.WithLabelValues(v.values(h.tags)...)
	return gaugeFunc(g.Set)
}

func (h *temporalHandler) Timer(name string) client.MetricsTimer {
	v := h.shared.vec(name, "timer", h.tags)
	if v.timer == nil {
		return client.MetricsNopHandler.Timer(name)
	}
	o := v.timer.WithLabelValues(v.values(h.tags)...)
	return timerFunc(func(d time.Duration) { o.Observe(d.Seconds()) })
}

// vec returns the collector of name, creating and registering it on first
// use. A name used as another kind than it was first gets no collector.
func (s *temporalVecs) vec(name, kind string, tags map[string]string) *temporalVec {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := kind + "/" + name
	if v, ok := s.vecs[key]; ok {
		return v
	}
	labels := slices.Sorted(maps.Keys(tags))
	for i, l := range labels {
		labels[i] = sanitize(l)
	}
	full := "temporal_" + sanitize(name)
	v := &temporalVec{labels: labels}
	var c prometheus.Collector
	switch kind {
	case "counter":
		v.counter = prometheus.NewCounterVec(prometheus.CounterOpts{Name: full + "_total", Help: "Temporal SDK counter " + name + "."}, labels)
		c = v.counter
	case "gauge":
		v.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: full, Help: "Temporal SDK gauge " + name + "."}, labels)
		c = v.gauge
	default:
		v.timer = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: full + "_seconds", Help: "Temporal SDK timer " + name + ".", Buckets: stageBuckets}, labels)
		c = v.timer
	}
	if err := s.reg.Register(c); err != nil {
		// Another kind already took the name: drop this one's values.
		*v = temporalVec{labels: labels}
	}
	s.vecs[key] = v
	return v
}

// values orders tags as the vec's labels, "" for those missing.
func (v *temporalVec) values(tags map[string]string) []string {
	out := make([]string, len(v.labels))
	for k, val := range tags {
		if i := slices.Index(v.labels, sanitize(k)); i >= 0 {
			out[i] = val
		}
	}
	return out
}

// sanitize makes an SDK metric name a valid Prometheus name.
func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, name)
}

type counterFunc func(int64)

func (f counterFunc) Inc(d int64) { f(d) }

type gaugeFunc func(float64)

func (f gaugeFunc) Update(v float64) { f(v) }

type timerFunc func(time.Duration)

func (f timerFunc) Record(d time.Duration) { f(d) }
