package fairness

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-dev/sluice/tests/load/internal/load"
)

// Permit utilisation as the pools benchmark measures it: each pool's
// sluice_permit_held_seconds_total and sluice_permit_decoding_seconds_total
// read from the API process's /metrics (its embedded worker streams and
// releases) at the window's start and at its end. What the window added
// is the held and decoding seconds of the permits given back and the
// streams ended within it; their ratio is the pool's utilisation.

// permitSeconds is a pool's held and decoding seconds.
type permitSeconds struct{ held, decoding float64 }

// utilisation is decoding over held; false when nothing was held.
func (p permitSeconds) utilisation() (float64, bool) {
	if p.held <= 0 {
		return 0, false
	}
	return p.decoding / p.held, true
}

// Names of the counters (pkg/metrics/permits.go).
const (
	metricPermitHeld     = "sluice_permit_held_seconds_total"
	metricPermitDecoding = "sluice_permit_decoding_seconds_total"
)

// readPermitSeconds reads each pool's permit seconds from a /metrics page,
// summed over its series.
func readPermitSeconds(ctx context.Context, hc *http.Client, url string) (map[string]permitSeconds, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read permit seconds: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read permit seconds: GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read permit seconds: parse %s: %w", url, err)
	}
	out := map[string]permitSeconds{}
	for _, name := range []string{metricPermitHeld, metricPermitDecoding} {
		for _, m := range fams[name].GetMetric() {
			pool := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" {
					pool = l.GetValue()
				}
			}
			s := out[pool]
			if name == metricPermitHeld {
				s.held += m.GetCounter().GetValue()
			} else {
				s.decoding += m.GetCounter().GetValue()
			}
			out[pool] = s
		}
	}
	return out, nil
}

// permitsAdded is what end adds to start, per pool.
func permitsAdded(start, end map[string]permitSeconds) map[string]permitSeconds {
	out := map[string]permitSeconds{}
	for pool, e := range end {
		s := start[pool]
		out[pool] = permitSeconds{held: e.held - s.held, decoding: e.decoding - s.decoding}
	}
	return out
}

// permitWindow reads the permit seconds at from and at to and sends what
// the window added (or why it could not be read) once to is past.
func permitWindow(ctx context.Context, hc *http.Client, url string, from, to time.Time) <-chan permitReading {
	out := make(chan permitReading, 1)
	go func() {
		defer close(out)
		if !load.SleepUntil(ctx, from) {
			return
		}
		start, err := readPermitSeconds(ctx, hc, url)
		if err != nil {
			out <- permitReading{err: err}
			return
		}
		if !load.SleepUntil(ctx, to) {
			return
		}
		end, err := readPermitSeconds(ctx, hc, url)
		out <- permitReading{pools: permitsAdded(start, end), err: err}
	}()
	return out
}

// permitReading is a window's permit seconds per pool, or the error that
// kept them from being read.
type permitReading struct {
	pools map[string]permitSeconds
	err   error
}

// line says each pool's utilisation over the window.
func (r permitReading) line() string {
	if r.err != nil {
		return "not measured: " + r.err.Error()
	}
	if len(r.pools) == 0 {
		return "not measured"
	}
	pools := make([]string, 0, len(r.pools))
	for p := range r.pools {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	parts := make([]string, 0, len(pools))
	for _, p := range pools {
		s := r.pools[p]
		u, ok := s.utilisation()
		if !ok {
			parts = append(parts, p+" held no permit")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.1f%% (%.1f s decoding of %.1f s held)", p, 100*u, s.decoding, s.held))
	}
	return strings.Join(parts, ", ")
}
