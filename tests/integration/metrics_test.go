package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/latency"
)

// After a request, the API's /metrics shows its stages, the pools, the
// cache tiers and the Temporal SDK's metrics; the shared latency window
// has its stages too.
func TestMetricsAfterARequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answer(t, ctx, `{"query":"What does the janitor reclaim?","max_tokens":8}`)

	out := scrape(t)
	for _, want := range []string{
		`sluice_stage_duration_seconds_count{cache="",outcome="done",pool="short",stage="llm"}`,
		`sluice_stage_duration_seconds_count{cache="",outcome="done",pool="short",stage="llm_first_token"}`,
		`sluice_requests_total{outcome="done",route="short"}`,
		`sluice_pool_permits_limit{pool="short"} 2`,
		`sluice_pool_queue_depth{pool="long"}`,
		`sluice_cache_misses_total{tier="retrieval"}`,
		`temporal_`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The window flushes every second.
	w, err := latency.New(stack.redis, latency.Options{KeyPrefix: keyPrefix})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := w.Snapshot(ctx, latency.Series("llm_first_token", "short"), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if st.Count > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no llm_first_token latency reached the shared window")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
