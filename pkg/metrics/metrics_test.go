package metrics

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/version"
)

func TestRequestsAndStages(t *testing.T) {
	m := New(nil)
	m.ObserveRequest(Request{Route: "short", Outcome: request.OutcomeDone, Timings: []events.StageTiming{
		{Stage: "embed", Ms: 2, Cache: "memory"}, {Stage: "admission", Ms: 1500}, {Stage: "llm", Ms: 800},
	}})
	m.ObserveRequest(Request{Route: "short", Outcome: OutcomeOf("rejected", "queue_timeout"), Timings: []events.StageTiming{{Stage: "admission", Ms: 30000}}})
	m.Refused(OutcomeRejectedRate)
	if got := testutil.ToFloat64(m.requests.WithLabelValues("done", "short")); got != 1 {
		t.Fatalf("done requests = %v", got)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("rejected_queue_timeout", "short")); got != 1 {
		t.Fatalf("queue-timeout requests = %v", got)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("rejected_rate", "")); got != 1 {
		t.Fatalf("rate-limited requests = %v", got)
	}
	if n := testutil.CollectAndCount(m.stages); n != 4 {
		t.Fatalf("%d stage series, want 4 (embed, admission done, llm, admission rejected)", n)
	}
	// The 1.5 s admission wait lands in the (1, 2.5] bucket of its series.
	out := scrape(t, m)
	for _, want := range []string{
		`sluice_stage_duration_seconds_bucket{cache="",outcome="done",pool="short",stage="admission",le="1"} 0`,
		`sluice_stage_duration_seconds_bucket{cache="",outcome="done",pool="short",stage="admission",le="2.5"} 1`,
		`sluice_stage_duration_seconds_count{cache="memory",outcome="done",pool="short",stage="embed"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

func TestRateLimitsPoolsAndCaches(t *testing.T) {
	m := New(nil)
	m.RateLimit("all", true)
	m.RateLimit("tenant", false)
	m.RateLimit("tenant", false)
	m.RegisterPools([]string{"short", "long"}, func(_ context.Context, pool string) (PoolStats, error) {
		if pool == "long" {
			return PoolStats{}, errors.New("redis down")
		}
		return PoolStats{InUse: 3, Limit: 4, Waiting: 7, OldestWait: 2500 * time.Millisecond}, nil
	})
	hits := uint64(5)
	m.RegisterCache("embedding", func() CacheStats { return CacheStats{Hits: hits, Misses: 2, Bytes: 4096} })
	hits = 6
	out := scrape(t, m)
	for _, want := range []string{
		`sluice_ratelimit_decisions_total{decision="allow",dimension="all"} 1`,
		`sluice_ratelimit_decisions_total{decision="deny",dimension="tenant"} 2`,
		`sluice_pool_permits_in_use{pool="short"} 3`,
		`sluice_pool_permits_limit{pool="short"} 4`,
		`sluice_pool_queue_depth{pool="short"} 7`,
		`sluice_pool_queue_oldest_wait_seconds{pool="short"} 2.5`,
		`sluice_cache_hits_total{tier="embedding"} 6`,
		`sluice_cache_misses_total{tier="embedding"} 2`,
		`sluice_cache_served_bytes_total{tier="embedding"} 4096`,
		`go_goroutines`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	// A pool whose stats cannot be read is left out, not reported as 0
	// (its utilisation counters are this process's own, not read).
	for _, gauge := range []string{"sluice_pool_permits_in_use", "sluice_pool_permits_limit", "sluice_pool_queue_depth", "sluice_pool_queue_oldest_wait_seconds"} {
		if strings.Contains(out, gauge+`{pool="long"}`) {
			t.Errorf("an unreadable pool was reported: %s", gauge)
		}
	}
}

// The SDK's metrics keep Temporal's names and tags: counters end in
// _total, timers are second histograms with buckets that fit seconds.
func TestTemporalHandler(t *testing.T) {
	m := New(nil)
	h := m.TemporalHandler().WithTags(map[string]string{"namespace": "default", "task_queue": "q"})
	h.Counter("temporal_request").Inc(2)
	// The same name tagged differently is another series of one family.
	h.WithTags(map[string]string{"operation": "Poll"}).Counter("temporal_request").Inc(1)
	h.Gauge("temporal_num_pollers").Update(4)
	h.WithTags(map[string]string{"workflow_type": "Chat"}).Timer("temporal_workflow_task_execution_latency").Record(30 * time.Millisecond)
	// A name first used as a counter and then as a gauge must not panic.
	h.Gauge("temporal_request").Update(1)
	out := scrape(t, m)
	for _, want := range []string{
		`temporal_request_total{namespace="default",task_queue="q"} 2`,
		`temporal_request_total{namespace="default",operation="Poll",task_queue="q"} 1`,
		`temporal_num_pollers{namespace="default",task_queue="q"} 4`,
		`temporal_workflow_task_execution_latency_seconds_bucket{namespace="default",task_queue="q",workflow_type="Chat",le="0.025"} 0`,
		`temporal_workflow_task_execution_latency_seconds_bucket{namespace="default",task_queue="q",workflow_type="Chat",le="0.05"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s in\n%s", want, grep(out, "temporal_"))
		}
	}
	if strings.Contains(out, "otel_scope") || strings.Contains(out, "target_info") {
		t.Errorf("scrape carries OpenTelemetry scope or target info:\n%s", grep(out, "otel_scope"))
	}
}

func TestTokensQueueWaitAndTTFT(t *testing.T) {
	m := New(nil)
	m.ObserveRequest(Request{Route: "short", Outcome: request.OutcomeDone, Tier: "pro",
		PromptTokens: 300, CompletionTokens: 40, Timings: []events.StageTiming{
			{Stage: "embed", Ms: 10}, {Stage: "admission", Ms: 1500}, {Stage: "llm_first_token", Ms: 200}, {Stage: "llm", Ms: 900},
		}})
	// A request the queue timed out used no tokens and saw no first token.
	m.ObserveRequest(Request{Route: "short", Outcome: OutcomeOf("rejected", "queue_timeout"), Tier: "free",
		Timings: []events.StageTiming{{Stage: "admission", Ms: 30000}}})
	out := scrape(t, m)
	for _, want := range []string{
		`sluice_llm_tokens_total{kind="prompt",pool="short",tier="pro"} 300`,
		`sluice_llm_tokens_total{kind="completion",pool="short",tier="pro"} 40`,
		`sluice_admission_wait_seconds_bucket{pool="short",tier="pro",le="1"} 0`,
		`sluice_admission_wait_seconds_bucket{pool="short",tier="pro",le="2.5"} 1`,
		`sluice_admission_wait_seconds_count{pool="short",tier="free"} 1`,
		// 10 + 1500 + 200 ms: the LLM's whole time is not waited for.
		`sluice_ttft_seconds_sum{pool="short",tier="pro"} 1.71`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s in\n%s", want, grep(out, `tier="`))
		}
	}
	for _, unwanted := range []string{`sluice_llm_tokens_total{kind="prompt",pool="short",tier="free"}`, `sluice_ttft_seconds_count{pool="short",tier="free"}`} {
		if strings.Contains(out, unwanted) {
			t.Errorf("scrape has %s", unwanted)
		}
	}
}

func TestHealingLevelsAgeOut(t *testing.T) {
	m := New(nil)
	now := time.Unix(1000, 0)
	m.healing.now = func() time.Time { return now }
	m.HealingLevel("short", 2, 30*time.Second)
	m.HealingLevel("long", 0, 30*time.Second)
	m.HealingAction("short", "set_permits")
	out := scrape(t, m)
	for _, want := range []string{
		`sluice_healing_level{pool="short"} 2`,
		`sluice_healing_level{pool="long"} 0`,
		`sluice_healing_actions_total{action="set_permits",pool="short"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s in\n%s", want, grep(out, "healing"))
		}
	}
	// Another worker runs the healer's polls now: this one's level of
	// short is old news and drops out; long was heard again.
	now = now.Add(20 * time.Second)
	m.HealingLevel("long", 1, 30*time.Second)
	now = now.Add(15 * time.Second)
	out = scrape(t, m)
	if strings.Contains(out, `sluice_healing_level{pool="short"}`) {
		t.Error("a level not heard for longer than its freshness is still reported")
	}
	if !strings.Contains(out, `sluice_healing_level{pool="long"} 1`) {
		t.Errorf("scrape lacks the fresh level of long in\n%s", grep(out, "healing_level"))
	}
}

func TestDependencyUp(t *testing.T) {
	m := New(nil)
	m.scrapeBudget = 50 * time.Millisecond
	m.RegisterDependency("redis", func(context.Context) error { return nil })
	m.RegisterDependency("temporal", func(ctx context.Context) error {
		<-ctx.Done() // a frontend that does not answer
		return ctx.Err()
	})
	out := scrape(t, m)
	for _, want := range []string{`sluice_dependency_up{dependency="redis"} 1`, `sluice_dependency_up{dependency="temporal"} 0`} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s in\n%s", want, grep(out, "dependency"))
		}
	}
}

func TestNilMetricsDoNothing(t *testing.T) {
	var m *Metrics
	m.ObserveRequest(Request{Outcome: request.OutcomeDone})
	m.Refused(OutcomeRejectedRate)
	m.RateLimit("ip", false)
	m.RegisterPools(nil, nil)
	m.RegisterCache("x", nil)
	m.RegisterBackends(nil)
	m.RegisterDependency("redis", nil)
	m.HealingLevel("short", 1, time.Minute)
	m.HealingAction("short", "shed")
	m.TrackTenants(5)
	m.TenantServed(TenantService{Tenant: "a", Pool: "short", PromptTokens: 1})
	m.RegisterTierWeights(nil)
	m.TemporalHandler().Counter("c").Inc(1)
}

func TestBackendCircuits(t *testing.T) {
	m := New(nil)
	state := 0
	m.RegisterBackends(func() []Circuit {
		return []Circuit{
			{Pool: "short", Endpoint: "short-0", State: state},
			{Pool: "short", Endpoint: "short-1", State: 0},
		}
	})
	// Read at scrape time: the gauge follows the breaker.
	state = 2
	out := scrape(t, m)
	for _, want := range []string{
		`sluice_backend_circuit_state{endpoint="short-0",pool="short"} 2`,
		`sluice_backend_circuit_state{endpoint="short-1",pool="short"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s in\n%s", want, grep(out, "circuit"))
		}
	}
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("scrape: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestHealingAlerts(t *testing.T) {
	m := New(nil)
	m.HealingAlert("short", "critical")
	m.HealingAlert("short", "critical")
	m.HealingAlert("long", "warn")
	if got := testutil.ToFloat64(m.alerts.WithLabelValues("short", "critical")); got != 2 {
		t.Fatalf("critical alerts of short = %v", got)
	}
	if !strings.Contains(scrape(t, m), `sluice_healing_alerts_total{level="warn",pool="long"} 1`) {
		t.Fatal("scrape lacks the warn alert")
	}
	var none *Metrics
	none.HealingAlert("short", "warn") // nil-safe
}

// Scrapes within snapshotTTL of a read, concurrent or not, replay it: a
// flood of scrapes on the public port costs Redis and Temporal one check
// a second. Later scrapes read again.
func TestScrapesShareOneDependencyRead(t *testing.T) {
	m := New(nil)
	var checks, reads atomic.Int32
	m.RegisterDependency("redis", func(context.Context) error { checks.Add(1); return nil })
	m.RegisterPools([]string{"short"}, func(context.Context, string) (PoolStats, error) {
		reads.Add(1)
		return PoolStats{InUse: 1, Limit: 2}, nil
	})
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if out := scrape(t, m); !strings.Contains(out, `sluice_pool_permits_limit{pool="short"} 2`) ||
				!strings.Contains(out, `sluice_dependency_up{dependency="redis"} 1`) {
				t.Errorf("a scrape lacks the shared read:\n%s", grep(out, "sluice_"))
			}
		})
	}
	wg.Wait()
	if checks.Load() != 1 || reads.Load() != 1 {
		t.Fatalf("20 scrapes within a second: %d dependency checks and %d pool reads, want 1 each", checks.Load(), reads.Load())
	}
	later := time.Now().Add(snapshotTTL)
	m.deps.last.now = func() time.Time { return later }
	scrape(t, m)
	if checks.Load() != 2 {
		t.Errorf("a scrape %s after the check: %d checks, want a second one", snapshotTTL, checks.Load())
	}
}

// Every scrape names the build, so a dashboard can tell which version
// each instance runs.
func TestBuildInfo(t *testing.T) {
	b := version.Get()
	want := `sluice_build_info{commit="` + b.Commit + `",go_version="` + b.GoVersion + `",version="` + b.Version + `"} 1`
	if out := scrape(t, New(nil)); !strings.Contains(out, want) {
		t.Fatalf("scrape lacks %s", want)
	}
}
