package activities_test

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
)

// permitSeconds reads a pool's sluice_permit_<kind>_seconds_total.
func permitSeconds(t *testing.T, m *metrics.Metrics, kind, pool string) float64 {
	t.Helper()
	return counterOf(t, m, "sluice_permit_"+kind+"_seconds_total", pool)
}

// counterOf reads the counter family name's series of pool.
func counterOf(t *testing.T, m *metrics.Metrics, name, pool string) float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "pool" && l.GetValue() == pool {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A stream's decoding runs from its first token to its end, and its
// permit's hold from the grant to the release the done event brings:
// held once, longer than decoding by the wait for the first token.
func TestStreamCountsPermitHeldAndDecoding(t *testing.T) {
	const delay = 40 * time.Millisecond
	m := metrics.New(quiet)
	fake := &fakeLLM{tokens: words(5), delay: delay}
	h := newHarness(t, func(o *harnessOptions) { o.streamer, o.holds = fake, m })
	h.acts.Metrics = m
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	in := activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
		Done: &activities.DoneFacts{RequestID: "r1", Route: "short", KBVersion: version},
	}
	if r := h.enqueue(t, in.Pool, in.RequestID); r.Status != admission.Granted {
		t.Fatalf("r1: %+v", r)
	}
	if _, err := streamAsIs(t, h, in, nil); err != nil {
		t.Fatal(err)
	}
	decoding := permitSeconds(t, m, "decoding", request.PoolShort)
	held := permitSeconds(t, m, "held", request.PoolShort)
	// Four tokens after the first, each delay apart.
	if lo, hi := (4 * delay).Seconds(), (4*delay + time.Second).Seconds(); decoding < lo || decoding > hi {
		t.Errorf("decoding %.3fs, want within [%.3f, %.3f]", decoding, lo, hi)
	}
	if held < decoding+delay.Seconds() {
		t.Errorf("held %.3fs, want at least decoding %.3fs and the first token's wait %v", held, decoding, delay)
	}
	// Finalize gives back nothing more: the permit's hold is counted once.
	mustLocal[struct{}](t, h, h.acts.Finalize, activities.FinalizeInput{RequestID: "r1", Pool: request.PoolShort})
	if again := permitSeconds(t, m, "held", request.PoolShort); again != held {
		t.Errorf("held %.3fs after Finalize, was %.3fs: counted twice", again, held)
	}
}
