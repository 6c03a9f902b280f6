package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// permitCounters measure permit utilisation per pool: the seconds permits
// were held, from grant to release (or to the end of a lease that ran
// out), and the seconds a held permit's sequence was decoding, from the
// backend's first token to the stream's end. Their ratio is the share of
// the pools' concurrency the backends spent producing tokens; the rest
// went to prefill and queueing inside the backend, the wait for the
// first token, and what happens around the stream while the permit is
// held (docs/traffic.md, "Permit utilisation"). streamed counts the output
// tokens charged to their tenants in the fair order while they streamed
// (pay as you go); the rest of an answer is settled at its release.
// paused counts streams that gave their permit to a more urgent waiter
// (preemption by continuation).
type permitCounters struct {
	held, decoding, streamed, paused *prometheus.CounterVec
}

func newPermitCounters() permitCounters {
	return permitCounters{
		held: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_permit_held_seconds_total",
			Help: "Seconds LLM permits were held, from grant to release (or to the end of a lease that ran out), per pool; counted by the instance that gave each permit back.",
		}, []string{"pool"}),
		decoding: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_permit_decoding_seconds_total",
			Help: "Seconds a held permit's stream was decoding, from the backend's first token to the stream's end (done, cancelled or failed), per pool.",
		}, []string{"pool"}),
		streamed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_admission_streamed_tokens_total",
			Help: "Output tokens charged to their tenants in the pool's fair order while they streamed (pay as you go), per pool; the rest of each answer is settled when its permit comes back.",
		}, []string{"pool"}),
		paused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_admission_pauses_total",
			Help: "Streams paused for a more urgent waiter (preemption by continuation), each giving its permit to it and continuing later, per pool.",
		}, []string{"pool"}),
	}
}

func (p permitCounters) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.held, p.decoding, p.streamed, p.paused}
}

// start makes each pool's series exist from the first scrape, at 0, so
// that a rate over a window that begins before a pool's first release is
// not missing.
func (p permitCounters) start(pools []string) {
	for _, pool := range pools {
		p.held.WithLabelValues(pool)
		p.decoding.WithLabelValues(pool)
		p.streamed.WithLabelValues(pool)
		p.paused.WithLabelValues(pool)
	}
}

// StreamedCharged counts tokens output tokens of a stream in pool charged
// to its tenant's place in the fair order while it streamed.
func (m *Metrics) StreamedCharged(pool string, tokens int64) {
	if m == nil || tokens <= 0 {
		return
	}
	m.permits.streamed.WithLabelValues(pool).Add(float64(tokens))
}

// StreamPaused counts a stream of pool that paused for a more urgent
// waiter.
func (m *Metrics) StreamPaused(pool string) {
	if m == nil {
		return
	}
	m.permits.paused.WithLabelValues(pool).Inc()
}

// PermitHeld counts a permit of pool held for d (admission.HoldRecorder).
func (m *Metrics) PermitHeld(pool string, d time.Duration) {
	if m == nil || d <= 0 {
		return
	}
	m.permits.held.WithLabelValues(pool).Add(d.Seconds())
}

// PermitDecoding counts d of a held permit's stream spent decoding, from
// its first token to its end.
func (m *Metrics) PermitDecoding(pool string, d time.Duration) {
	if m == nil || d <= 0 {
		return
	}
	m.permits.decoding.WithLabelValues(pool).Add(d.Seconds())
}
