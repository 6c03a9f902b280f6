package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/backend"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/scaler"
	"github.com/sluice-dev/sluice/worker"
)

// healingHarness is an *activities.Healing over the test Redis, a key
// prefix of its own and an in-process llmsim serving the short pool.
type healingHarness struct {
	h       *activities.Healing
	rdb     *redis.Client
	gate    *admission.Gate
	window  *latency.Window
	policy  *policy.Store
	sim     *llmsim.Server
	simURL  string
	shed    *fakeShedNotifier
	metrics *metrics.Metrics
	cfg     config.Config
}

type fakeShedNotifier struct {
	mu  sync.Mutex
	ids []string
}

func (n *fakeShedNotifier) NotifyShed(_ context.Context, pool, requestID string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ids = append(n.ids, pool+"/"+requestID)
	return nil
}

func newHealingHarness(t *testing.T, mod func(*activities.Healing)) *healingHarness {
	t.Helper()
	cfg := config.Default()
	prefix := fmt.Sprintf("heal:%s:%d:", t.Name(), runSeq.Add(1))
	cfg.Redis.KeyPrefix = prefix
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	gate, err := admission.New(rdb, admission.Options{
		KeyPrefix: prefix, Lease: 10 * time.Second, WaiterTTL: time.Minute, MaxQueueDepth: 100,
		Limits: map[string]int{request.PoolShort: cfg.Pools.Short.MaxConcurrency, request.PoolLong: cfg.Pools.Long.MaxConcurrency},
	})
	if err != nil {
		t.Fatal(err)
	}
	window, err := latency.New(rdb, latency.Options{KeyPrefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	simCfg := llmsim.DefaultConfig()
	simCfg.TimeScale = 0.01
	sim, err := llmsim.New(simCfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	simScaler, err := scaler.NewSimulator(scaler.SimulatorOptions{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	store := worker.NewPolicy(rdb, cfg, gate, quiet)
	m := metrics.New(quiet)
	shed := &fakeShedNotifier{}
	h := &activities.Healing{
		Gate: gate, Latency: window, Policy: store, Notifier: shed, Metrics: m, Logger: quiet,
		Pools: map[string]activities.HealingPool{
			// The OpenAI base URL, as configured: /v1 is stripped.
			request.PoolShort: {Endpoints: []string{srv.URL + "/v1"}, MinPermits: 2, MaxPermits: 16, MinBatch: 2, MaxBatch: 16,
				Scaler: simScaler, MinReplicas: 1, MaxReplicas: 4},
			request.PoolLong: {Endpoints: []string{"http://127.0.0.1:1"}, MinPermits: 1, MaxPermits: 4},
		},
		Backends: backend.Client{Timeout: time.Second},
	}
	if mod != nil {
		mod(h)
	}
	return &healingHarness{h: h, rdb: rdb, gate: gate, window: window, policy: store, sim: sim, simURL: srv.URL, shed: shed, metrics: m, cfg: cfg}
}

func TestReadHealth(t *testing.T) {
	hh := newHealingHarness(t, nil)
	ctx := context.Background()
	// What Finalize's report records: first tokens of the short pool with
	// a tail, its requests and queue timeouts.
	series := latency.Series("llm_first_token", request.PoolShort)
	for i := range 200 {
		d := 100 * time.Millisecond
		if i%20 == 0 {
			d = 2 * time.Second
		}
		hh.window.Record(series, d)
	}
	hh.window.Add(latency.Series("requests", request.PoolShort), 200)
	hh.window.Add(latency.Series("queue_timeouts", request.PoolShort), 10)
	if err := hh.window.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Two waiters behind a long pool that holds one permit of one.
	if err := hh.gate.SetLimit(ctx, request.PoolLong, 1); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := hh.gate.Enqueue(ctx, request.PoolLong, admission.Request{ID: id, Tenant: "t", Weight: 1}); err != nil {
			t.Fatal(err)
		}
	}

	out, err := hh.h.ReadHealth(ctx, activities.HealthInput{Pools: []string{request.PoolShort, request.PoolLong}, Stage: "llm_first_token", Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Pools) != 2 || out.Pools[0].Pool != request.PoolShort || out.Pools[1].Pool != request.PoolLong {
		t.Fatalf("pools %+v, want short then long", out.Pools)
	}
	short, long := out.Pools[0], out.Pools[1]
	if short.Samples != 200 || short.Ratio < 15 || short.Ratio > 25 || short.P50Ms < 90 || short.P50Ms > 110 {
		t.Errorf("short tail %+v, want 200 samples, P50 ~100ms, P99/P50 ~20", short)
	}
	if short.Requests != 200 || short.Timeouts != 10 || short.TimeoutRate != 0.05 {
		t.Errorf("short counters %+v", short)
	}
	if short.Permits != 16 || short.QueueDepth != 0 {
		t.Errorf("short gate %+v", short)
	}
	// The idle simulator answers: nothing cached, nothing waiting.
	if short.KVCacheUsage != 0 || short.BackendWaiting != 0 {
		t.Errorf("short backend %v %v, want 0 0 from llmsim", short.KVCacheUsage, short.BackendWaiting)
	}
	if long.Samples != 0 || long.Ratio != 0 || long.Permits != 1 || long.InUse != 1 || long.QueueDepth != 2 {
		t.Errorf("long %+v, want no samples, 1 permit in use, 2 waiting", long)
	}
	// Its one backend is down.
	if long.KVCacheUsage != -1 || long.BackendWaiting != -1 {
		t.Errorf("long backend %v %v, want -1 -1 (down)", long.KVCacheUsage, long.BackendWaiting)
	}
	if _, err := hh.h.ReadHealth(ctx, activities.HealthInput{Pools: []string{"nope"}, Stage: "llm_first_token", Window: time.Minute}); !isAppError(err, activities.ErrTypeBadRequest) {
		t.Errorf("unknown pool: %v", err)
	}
}

// Backends export several series of a gauge (one per model or engine) and,
// in newer vLLM, a renamed KV-cache gauge; the worst endpoint counts.
func TestReadHealthParsesVLLMMetrics(t *testing.T) {
	serve := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	old := serve(`# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:num_requests_waiting{model_name="m"} 3
vllm:num_requests_waiting_total 99
`)
	v1 := serve(`vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.8 1712345678000
vllm:num_requests_waiting{engine="0",model_name="m"} 4
vllm:num_requests_waiting{engine="1",model_name="m"} 5
`)
	tgi := serve("tgi_queue_size 7\n")
	hh := newHealingHarness(t, func(h *activities.Healing) {
		p := h.Pools[request.PoolLong]
		p.Endpoints = []string{old + "/v1/", v1, tgi, "http://127.0.0.1:1"}
		h.Pools[request.PoolLong] = p
	})
	out, err := hh.h.ReadHealth(context.Background(), activities.HealthInput{Pools: []string{request.PoolLong}, Stage: "llm_first_token", Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Pools[0]; got.KVCacheUsage != 0.8 || got.BackendWaiting != 9 {
		t.Fatalf("kv %v waiting %d, want 0.8 and 9 (the v1 engine's two series)", got.KVCacheUsage, got.BackendWaiting)
	}
}

func TestSetPermitsThroughThePolicy(t *testing.T) {
	hh := newHealingHarness(t, nil)
	ctx := context.Background()
	for range 2 { // a retry is a no-op
		if err := hh.h.SetPermits(ctx, activities.SetPermitsInput{Pool: request.PoolShort, Permits: 8, Reason: "p99/p50 7"}); err != nil {
			t.Fatal(err)
		}
	}
	if p := hh.policy.Current(); p.Pools[request.PoolShort] != 8 || p.Pools[request.PoolLong] != config.Default().Pools.Long.MaxConcurrency || p.Version != 1 {
		t.Fatalf("policy %+v, want short 8 at version 1", p)
	}
	st, err := hh.gate.Stats(ctx, request.PoolShort)
	if err != nil || st.Limit != 8 {
		t.Fatalf("gate limit %d, %v; want 8", st.Limit, err)
	}
	// Another instance sees it.
	other := worker.NewPolicy(hh.rdb, hh.cfg, hh.gate, quiet)
	if err := other.Refresh(ctx); err != nil || other.Current().Pools[request.PoolShort] != 8 {
		t.Fatalf("other instance sees %+v, %v", other.Current(), err)
	}
	for _, bad := range []int{0, 1, 17} {
		err := hh.h.SetPermits(ctx, activities.SetPermitsInput{Pool: request.PoolShort, Permits: bad})
		if !isAppError(err, activities.ErrTypeOutOfBounds) {
			t.Errorf("permits %d: %v, want out of bounds", bad, err)
		}
	}
}

func TestSetBatchOnBackendsWithAnAdminAPI(t *testing.T) {
	plain := httptest.NewServer(http.NotFoundHandler()) // vLLM: no /admin/config
	t.Cleanup(plain.Close)
	hh := newHealingHarness(t, nil)
	p := hh.h.Pools[request.PoolShort]
	p.Endpoints = append(p.Endpoints, plain.URL)
	hh.h.Pools[request.PoolShort] = p
	ctx := context.Background()
	for range 2 {
		out, err := hh.h.SetBatch(ctx, activities.SetBatchInput{Pool: request.PoolShort, MaxNumSeqs: 4, Reason: "shrink"})
		if err != nil {
			t.Fatal(err)
		}
		if out.Applied != 1 || out.Endpoints != 2 {
			t.Fatalf("set batch %+v, want 1 of 2 applied", out)
		}
	}
	if got := hh.sim.RuntimeConfig().MaxNumSeqs; got != 4 {
		t.Fatalf("llmsim max_num_seqs %d, want 4", got)
	}
	if _, err := hh.h.SetBatch(ctx, activities.SetBatchInput{Pool: request.PoolShort, MaxNumSeqs: 1}); !isAppError(err, activities.ErrTypeOutOfBounds) {
		t.Errorf("below min_batch: %v", err)
	}
	// The long pool's batch is not tuned.
	if _, err := hh.h.SetBatch(ctx, activities.SetBatchInput{Pool: request.PoolLong, MaxNumSeqs: 4}); !isAppError(err, activities.ErrTypeOutOfBounds) {
		t.Errorf("untuned pool: %v", err)
	}
	// A backend that is down fails the call, to be retried.
	p.Endpoints = append(p.Endpoints, "http://127.0.0.1:1")
	hh.h.Pools[request.PoolShort] = p
	if _, err := hh.h.SetBatch(ctx, activities.SetBatchInput{Pool: request.PoolShort, MaxNumSeqs: 8}); err == nil || isAppError(err, "") {
		t.Errorf("a down backend: %v, want a retryable error", err)
	}
}

func TestThrottleLong(t *testing.T) {
	hh := newHealingHarness(t, nil)
	ctx := context.Background()
	if err := hh.h.ThrottleLong(ctx, activities.ThrottleLongInput{CostFactor: 2, Reason: "level 2"}); err != nil {
		t.Fatal(err)
	}
	if p := hh.policy.Current(); p.LongCostFactor != 2 || p.ChargeFactor(request.PoolLong) != 2 || p.ChargeFactor(request.PoolShort) != 1 {
		t.Fatalf("policy %+v", p)
	}
	if err := hh.h.ThrottleLong(ctx, activities.ThrottleLongInput{CostFactor: 1, Reason: "healthy"}); err != nil {
		t.Fatal(err)
	}
	if p := hh.policy.Current(); p.LongCostFactor != 0 || p.Version != 2 {
		t.Fatalf("after stepping back %+v", p)
	}
	for _, bad := range []float64{0.5, 11} {
		if err := hh.h.ThrottleLong(ctx, activities.ThrottleLongInput{CostFactor: bad}); !isAppError(err, activities.ErrTypeOutOfBounds) {
			t.Errorf("factor %v: %v", bad, err)
		}
	}
}

func TestScale(t *testing.T) {
	hh := newHealingHarness(t, nil)
	ctx := context.Background()
	for range 2 {
		if err := hh.h.Scale(ctx, activities.ScaleInput{Pool: request.PoolShort, Replicas: 3, Reason: "level 3"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := hh.sim.RuntimeConfig().Replicas; got != 3 {
		t.Fatalf("llmsim replicas %d, want 3", got)
	}
	if err := hh.h.Scale(ctx, activities.ScaleInput{Pool: request.PoolShort, Replicas: 5}); !isAppError(err, activities.ErrTypeOutOfBounds) {
		t.Errorf("beyond max_replicas: %v", err)
	}
	if err := hh.h.Scale(ctx, activities.ScaleInput{Pool: request.PoolLong, Replicas: 2}); !isAppError(err, activities.ErrTypeNoScaler) {
		t.Errorf("no scaler: %v", err)
	}
	// A scaler that refuses for good (404: a wrong URL) is not retried.
	gone, err := scaler.NewSimulator(scaler.SimulatorOptions{URL: hh.simURL + "/nope"})
	if err != nil {
		t.Fatal(err)
	}
	p := hh.h.Pools[request.PoolShort]
	p.Scaler = gone
	hh.h.Pools[request.PoolShort] = p
	if err := hh.h.Scale(ctx, activities.ScaleInput{Pool: request.PoolShort, Replicas: 2}); !isAppError(err, activities.ErrTypeScaleRefused) {
		t.Errorf("refused: %v", err)
	}
}

func TestShedRejectsTheLowestTier(t *testing.T) {
	hh := newHealingHarness(t, nil)
	ctx := context.Background()
	if err := hh.gate.SetLimit(ctx, request.PoolShort, 1); err != nil {
		t.Fatal(err)
	}
	for _, r := range []admission.Request{
		{ID: "holder", Tenant: "x", Weight: 3},
		{ID: "free-1", Tenant: "f", Weight: 2},
		{ID: "vip-1", Tenant: "v", Weight: 5},
		{ID: "free-2", Tenant: "g", Weight: 2},
	} {
		if _, err := hh.gate.Enqueue(ctx, request.PoolShort, r); err != nil {
			t.Fatal(err)
		}
	}
	// As an activity, so that the shed is keyed by it: a retry must not
	// shed the next tier.
	// As an activity, so that the shed is keyed by it (a retry of the same
	// activity answers what the first attempt shed; see admission's tests).
	env := (&testsuite.WorkflowTestSuite{}).NewTestActivityEnvironment()
	env.RegisterActivity(hh.h)
	shed := func() activities.ShedOutput {
		t.Helper()
		val, err := env.ExecuteActivity(hh.h.Shed, activities.ShedInput{Pool: request.PoolShort, Reason: "level 4"})
		if err != nil {
			t.Fatal(err)
		}
		var out activities.ShedOutput
		if err := val.Get(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := shed(); out.Shed != 2 || out.Weight != 2 {
		t.Fatalf("shed %+v, want the two free requests", out)
	}
	hh.shed.mu.Lock()
	got := slices.Sorted(slices.Values(hh.shed.ids))
	hh.shed.mu.Unlock()
	if want := []string{"short/free-1", "short/free-2"}; !slices.Equal(got, want) {
		t.Fatalf("notified %v, want %v", got, want)
	}
	// Only the vip tier waits now: it is never shed on its own.
	if out := shed(); out.Shed != 0 {
		t.Fatalf("second shed %+v, want nothing", out)
	}
	if pos, ok, _ := hh.gate.Position(ctx, request.PoolShort, "vip-1"); !ok || pos != 1 {
		t.Fatalf("vip-1 at %d %v, want first and only", pos, ok)
	}
	// A shed request's re-check is refused as shed.
	res, err := hh.gate.Enqueue(ctx, request.PoolShort, admission.Request{ID: "free-1", Tenant: "f", Weight: 2})
	if err != nil || res.Status != admission.Shed {
		t.Fatalf("re-check of a shed request: %v %v", res.Status, err)
	}
}

func TestAlert(t *testing.T) {
	var mu sync.Mutex
	var got []map[string]any
	status := http.StatusOK
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&body) != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, body)
		w.WriteHeader(status)
	}))
	t.Cleanup(hook.Close)
	hh := newHealingHarness(t, func(h *activities.Healing) { h.Alerts.URL = hook.URL + "/alerts" })
	ctx := context.Background()
	in := activities.AlertInput{Pool: request.PoolShort, Level: "critical", Message: "P99/P50 = 7.2",
		Health: activities.PoolHealth{Pool: request.PoolShort, Ratio: 7.2, Samples: 300}}
	if err := hh.h.Alert(ctx, in); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(got) != 1 || got[0]["pool"] != "short" || got[0]["level"] != "critical" || got[0]["message"] != "P99/P50 = 7.2" {
		t.Fatalf("webhook got %v", got)
	}
	health, _ := got[0]["health"].(map[string]any)
	if health["Ratio"] != 7.2 {
		t.Fatalf("webhook health %v", health)
	}
	status = http.StatusBadGateway
	mu.Unlock()
	rec := httptest.NewRecorder()
	hh.metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if want := `sluice_healing_alerts_total{level="critical",pool="short"} 1`; !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
	// A webhook answering 5xx fails the activity, to be retried.
	err := hh.h.Alert(ctx, in)
	if err == nil || !strings.Contains(err.Error(), "502") || isAppError(err, "") {
		t.Fatalf("failing webhook: %v", err)
	}
	// A URL no request can be built for is not retried.
	hh.h.Alerts.URL = "http://[::1"
	if err := hh.h.Alert(ctx, in); !isAppError(err, activities.ErrTypeBadRequest) {
		t.Fatalf("malformed webhook URL: %v", err)
	}
}

// isAppError reports whether err is a non-retryable application error of
// type typ ("" for any type).
func isAppError(err error, typ string) bool {
	var ae *temporal.ApplicationError
	if !errors.As(err, &ae) {
		return false
	}
	return ae.NonRetryable() && (typ == "" || ae.Type() == typ)
}

// The healer sees how many of a pool's backends this worker's circuit
// breakers have ejected.
func TestReadHealthCountsEjectedBackends(t *testing.T) {
	hh := newHealingHarness(t, nil)
	good := hh.simURL
	dead := "http://127.0.0.1:1" // nothing listens: every stream fails to connect
	client, err := llm.NewOpenAI(llm.OpenAIOptions{
		Name: request.PoolLong, Endpoints: []string{good, dead},
		Breaker: llm.Breaker{Failures: 1, OpenFor: time.Minute}, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := hh.h.Pools[request.PoolLong]
	p.Endpoints, p.Circuits = []string{good, dead}, client.Circuits
	hh.h.Pools[request.PoolLong] = p
	read := func() activities.PoolHealth {
		out, err := hh.h.ReadHealth(context.Background(), activities.HealthInput{Pools: []string{request.PoolLong}, Stage: "llm_first_token", Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return out.Pools[0]
	}
	if ph := read(); ph.Endpoints != 2 || ph.Ejected != 0 {
		t.Fatalf("before any stream: %d of %d ejected, want 0 of 2", ph.Ejected, ph.Endpoints)
	}
	for range 2 { // round robin: one stream to each endpoint
		_, _ = client.Stream(context.Background(), llm.Request{Model: "sluice-sim", Messages: []openai.Message{openai.TextMessage("user", "hi")}, MaxTokens: 2},
			func(llm.Delta) error { return nil })
	}
	if ph := read(); ph.Endpoints != 2 || ph.Ejected != 1 {
		t.Fatalf("after the dead endpoint failed: %d of %d ejected, want 1 of 2", ph.Ejected, ph.Endpoints)
	}
}
