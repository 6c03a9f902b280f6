package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// snapshotTTL is how long what a collector read from Redis or Temporal
// answers scrapes again. /metrics may be on the public port (unless
// metrics.addr moves it) and needs no key: a flood of scrapes then costs
// the shared dependencies one read a second, not one per scrape, and
// concurrent scrapes share one read. Prometheus scrapes every 15 s or
// so, far slower than this.
const snapshotTTL = time.Second

// snapshot replays a collector's last metrics for snapshotTTL.
type snapshot struct {
	mu      sync.Mutex
	at      time.Time
	metrics []prometheus.Metric
	now     func() time.Time
}

// collect sends the metrics read less than snapshotTTL ago, or reads them
// anew with read (one caller at a time; the others wait and share).
func (s *snapshot) collect(ch chan<- prometheus.Metric, read func(chan<- prometheus.Metric)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now
	if s.now != nil {
		now = s.now
	}
	if s.at.IsZero() || now().Sub(s.at) >= snapshotTTL {
		fresh := make(chan prometheus.Metric)
		done := make(chan struct{})
		var got []prometheus.Metric
		go func() {
			defer close(done)
			for m := range fresh {
				got = append(got, m)
			}
		}()
		read(fresh)
		close(fresh)
		<-done
		s.metrics, s.at = got, now()
	}
	for _, m := range s.metrics {
		ch <- m
	}
}
