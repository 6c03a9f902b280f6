package metrics

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Each pool's held and decoding seconds start at 0 with the pools and add
// up what they are told; nothing counts on a nil Metrics.
func TestPermitUtilisationCounters(t *testing.T) {
	m := New(nil)
	m.RegisterPools([]string{"short", "long"}, func(context.Context, string) (PoolStats, error) { return PoolStats{}, nil })
	out := scrape(t, m)
	for _, want := range []string{
		`sluice_permit_held_seconds_total{pool="long"} 0`,
		`sluice_permit_decoding_seconds_total{pool="short"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape before any release lacks %s", want)
		}
	}
	m.PermitHeld("short", 2*time.Second)
	m.PermitHeld("short", 500*time.Millisecond)
	m.PermitDecoding("short", 1500*time.Millisecond)
	m.PermitDecoding("short", -time.Second) // a clock step: ignored
	m.StreamedCharged("long", 30)
	m.StreamedCharged("long", 12)
	m.StreamedCharged("long", 0)
	out = scrape(t, m)
	for _, want := range []string{
		`sluice_admission_streamed_tokens_total{pool="long"} 42`,
		`sluice_admission_streamed_tokens_total{pool="short"} 0`,
		`sluice_permit_held_seconds_total{pool="short"} 2.5`,
		`sluice_permit_decoding_seconds_total{pool="short"} 1.5`,
		`sluice_permit_held_seconds_total{pool="long"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	var nilM *Metrics
	nilM.PermitHeld("short", time.Second)
	nilM.PermitDecoding("short", time.Second)
	nilM.StreamedCharged("short", 1)
}
