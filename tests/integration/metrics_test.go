package integration

import (
	"context"
	"net/http"
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

// A request's tokens reach its tenant's service counters on the metrics
// port once Finalize has run, by pool, tier and kind, once; the tenant
// then has a backlog series, and the tiers' weights are there for the
// fairness rules. With metrics.addr set, the public port serves no
// /metrics at all.
func TestTenantServiceAfterARequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	served := func(pool, kind string) float64 {
		m := findMetric(scrapeFamilies(t)["sluice_tenant_llm_tokens_total"],
			map[string]string{"tenant": "acme", "pool": pool, "tier": "standard", "kind": kind})
		return m.GetCounter().GetValue() // 0 for nil: not served yet
	}
	prompt, completion := served("short", "prompt"), served("short", "completion")
	_, done, _ := answerAs(t, ctx, "k-acme", `{"query":"What does the janitor reclaim?","max_tokens":8}`)
	if done.Route != "short" || done.Usage.PromptTokens == 0 || done.Usage.CompletionTokens == 0 {
		t.Fatalf("done %+v: want a short answer with its usage", done)
	}
	// The client has its done event before the workflow's Finalize runs.
	wantPrompt, wantCompletion := prompt+float64(done.Usage.PromptTokens), completion+float64(done.Usage.CompletionTokens)
	deadline := time.Now().Add(10 * time.Second)
	for served("short", "prompt") != wantPrompt || served("short", "completion") != wantCompletion {
		if time.Now().After(deadline) {
			t.Fatalf("acme's short tokens: prompt %v, completion %v; want %v, %v",
				served("short", "prompt"), served("short", "completion"), wantPrompt, wantCompletion)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The queues are read at most once a second: the read after acme was
	// served has its backlog (0) too.
	families := scrapeFamilies(t)
	for findMetric(families["sluice_tenant_backlog"], map[string]string{"tenant": "acme", "pool": "short"}) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no sluice_tenant_backlog of acme in the short pool:\n%s", describe(families["sluice_tenant_backlog"]))
		}
		time.Sleep(200 * time.Millisecond)
		families = scrapeFamilies(t)
	}
	if m := findMetric(families["sluice_tier_weight"], map[string]string{"tier": "standard"}); m.GetGauge().GetValue() != 3 {
		t.Errorf("sluice_tier_weight{tier=standard} = %v, want 3", m.GetGauge().GetValue())
	}
	resp, err := http.Get(stack.baseURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /metrics on the public port: %d, want 404 with metrics.addr set", resp.StatusCode)
	}
}
