package activities_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
)

// A finished request is reported once: to the metrics, and for a request
// that reached a pool, to the latency window shared across instances.
func TestFinalizeReportsTheRequest(t *testing.T) {
	h := newHarness(t, nil)
	m := metrics.New(quiet)
	w, err := latency.New(h.rdb, latency.Options{KeyPrefix: h.prefix})
	if err != nil {
		t.Fatal(err)
	}
	h.acts.Metrics, h.acts.Latency = m, w
	timings := []events.StageTiming{{Stage: "embed", Ms: 1, Cache: "miss"}, {Stage: "admission", Ms: 30000}}
	finalize(t, h, activities.FinalizeInput{
		RequestID: "r1", EventType: events.TypeRejected, Failure: &events.Failure{Reason: "queue_timeout"},
		Report: &activities.Report{Route: request.PoolShort, Outcome: "rejected", Reason: "queue_timeout", Timings: timings},
	})
	// Refused before routing: counted, but no pool's latency.
	finalize(t, h, activities.FinalizeInput{
		RequestID: "r2", EventType: events.TypeError, Failure: &events.Failure{Reason: "internal_error"},
		Report: &activities.Report{Outcome: "failed", Reason: "internal_error", Timings: timings[:1]},
	})
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sluice_requests_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			var outcome, route string
			for _, l := range mt.GetLabel() {
				switch l.GetName() {
				case "outcome":
					outcome = l.GetValue()
				case "route":
					route = l.GetValue()
				}
			}
			counts[outcome+"/"+route] = mt.GetCounter().GetValue()
		}
	}
	if counts["rejected_queue_timeout/short"] != 1 || counts["failed/"] != 1 || len(counts) != 2 {
		t.Fatalf("requests_total %v", counts)
	}
	ctx := context.Background()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := w.Snapshots(ctx, time.Minute, latency.Series("admission", "short"), latency.Series("requests", "short"),
		latency.Series("queue_timeouts", "short"), latency.Series("embed", ""))
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Count != 1 || st[0].P50 < 28*time.Second || st[1].Added != 1 || st[2].Added != 1 || st[3].Count != 0 {
		t.Fatalf("latency window %+v", st)
	}
	// Time to first token: the stages before it and the first token, not
	// the rest of the answer; only requests that got a first token.
	finalize(t, h, activities.FinalizeInput{RequestID: "r3", Report: &activities.Report{Route: request.PoolLong, Outcome: "done", Timings: []events.StageTiming{
		{Stage: "embed", Ms: 100}, {Stage: "admission", Ms: 2000}, {Stage: "retrieval", Ms: 300},
		{Stage: "llm_first_token", Ms: 600}, {Stage: "llm", Ms: 9000},
	}}})
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st, err = w.Snapshots(ctx, time.Minute, latency.Series(request.SeriesTTFT, "long"), latency.Series(request.SeriesTTFT, "short"))
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Count != 1 || st[0].P50 < 2850*time.Millisecond || st[0].P50 > 3150*time.Millisecond || st[1].Count != 0 {
		t.Fatalf("ttft %+v, want one of 3 s in the long pool and none in the short (no first token)", st)
	}
}
