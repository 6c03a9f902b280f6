package backend_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/backend"
)

// serve answers /metrics with body and records the Accept header asked.
func serve(t *testing.T, body string, accept *string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		if accept != nil {
			*accept = r.Header.Get("Accept")
		}
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// Backends export several series of a gauge (one per model or engine) and,
// in newer vLLM, a renamed KV-cache gauge.
func TestMetricsReadsVLLMGauges(t *testing.T) {
	for _, tc := range []struct {
		name, body       string
		kvCache, waiting float64
	}{
		{"vLLM V0, a counter of a longer name beside the gauge", `# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:num_requests_waiting{model_name="m"} 3
vllm:num_requests_waiting_total 99
`, 0.5, 3},
		{"vLLM V1, two engines, a timestamp", `vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.8 1712345678000
vllm:num_requests_waiting{engine="0",model_name="m"} 4
vllm:num_requests_waiting{engine="1",model_name="m"} 5
`, 0.8, 9},
		{"both KV-cache gauges: the larger", `vllm:gpu_cache_usage_perc 0.3
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:kv_cache_usage_perc{engine="1"} 0.2
`, 0.4, -1},
		{"typed gauges, blank lines, no last newline", "# TYPE vllm:num_requests_waiting gauge\n\n  vllm:num_requests_waiting 2\nvllm:gpu_cache_usage_perc 0.25", 0.25, 2},
		{"a histogram of the name is not a gauge", `# TYPE vllm:num_requests_waiting histogram
vllm:num_requests_waiting_bucket{le="+Inf"} 1
vllm:num_requests_waiting_sum 1
vllm:num_requests_waiting_count 1
`, -1, -1},
		{"TGI: none of vLLM's names", "tgi_queue_size 7\n", -1, -1},
		{"empty", "", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var accept string
			url := serve(t, tc.body, &accept)
			m, err := (&backend.Client{}).Metrics(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			if m.KVCacheUsage != tc.kvCache || m.Waiting != tc.waiting {
				t.Errorf("got %+v, want KV cache %v, waiting %v", m, tc.kvCache, tc.waiting)
			}
			if !strings.HasPrefix(accept, "text/plain; version=0.0.4") {
				t.Errorf("Accept %q, want the classic text format", accept)
			}
		})
	}
}

func TestMetricsFromTheSimulator(t *testing.T) {
	url := newSim(t).url
	// The OpenAI base URL, as configured, is taken too.
	m, err := (&backend.Client{}).Metrics(context.Background(), url+"/v1/")
	if err != nil {
		t.Fatal(err)
	}
	if m.KVCacheUsage != 0 || m.Waiting != 0 {
		t.Fatalf("idle simulator: %+v, want 0 and 0", m)
	}
}

func TestMetricsFailures(t *testing.T) {
	ctx := context.Background()
	malformed := serve(t, "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc{engine 0.5\n", nil)
	if _, err := (&backend.Client{}).Metrics(ctx, malformed); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("malformed exposition: %v, want a parse error at line 2", err)
	}
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "starting", http.StatusServiceUnavailable)
	}))
	t.Cleanup(failing.Close)
	if _, err := (&backend.Client{}).Metrics(ctx, failing.URL); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("503: %v", err)
	}
	if _, err := (&backend.Client{}).Metrics(ctx, "http://127.0.0.1:1"); err == nil {
		t.Error("a down backend answered")
	}
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	start := time.Now()
	if _, err := (&backend.Client{Timeout: 50 * time.Millisecond}).Metrics(ctx, slow.URL); err == nil {
		t.Error("a hung backend answered")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a hung backend held the scrape %v, past its 50ms timeout", d)
	}
}

func TestBase(t *testing.T) {
	for in, want := range map[string]string{
		"http://vllm:8000/v1":  "http://vllm:8000",
		"http://vllm:8000/v1/": "http://vllm:8000",
		"http://vllm:8000/":    "http://vllm:8000",
		"http://vllm:8000":     "http://vllm:8000",
		"http://gw/pool/v1":    "http://gw/pool",
	} {
		if got := backend.Base(in); got != want {
			t.Errorf("Base(%q) = %q, want %q", in, got, want)
		}
	}
}
