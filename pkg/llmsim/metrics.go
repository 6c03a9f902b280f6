package llmsim

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Histogram buckets follow vLLM's, so dashboards and alerts written for a
// real vLLM work unchanged against the simulator.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	tpotBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
)

type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	count  uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += v
	h.count++
}

// metrics holds the counters and histograms; gauges are read from the
// replicas at scrape time. The text format is written by hand to keep the
// package on the standard library.
type metrics struct {
	model string

	mu               sync.Mutex
	promptTotal      uint64
	generationTotal  uint64
	preemptionsTotal uint64
	success          map[string]uint64
	ttft, e2e, tpot  *histogram
}

func newMetrics(model string) *metrics {
	return &metrics{
		model:   model,
		success: map[string]uint64{finishStop: 0, finishLength: 0, finishAbort: 0},
		ttft:    newHistogram(ttftBuckets),
		e2e:     newHistogram(e2eBuckets),
		tpot:    newHistogram(tpotBuckets),
	}
}

func (m *metrics) promptTokens(n int) {
	m.mu.Lock()
	m.promptTotal += uint64(n)
	m.mu.Unlock()
}

func (m *metrics) preemption() {
	m.mu.Lock()
	m.preemptionsTotal++
	m.mu.Unlock()
}

func (m *metrics) preemptions() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(m.preemptionsTotal)
}

func (m *metrics) firstToken(ttft time.Duration) {
	m.mu.Lock()
	m.generationTotal++
	m.ttft.observe(ttft.Seconds())
	m.mu.Unlock()
}

func (m *metrics) nextToken(gap time.Duration) {
	m.mu.Lock()
	m.generationTotal++
	m.tpot.observe(gap.Seconds())
	m.mu.Unlock()
}

// finished counts a request by finish reason; only requests that completed
// contribute to the end-to-end latency histogram.
func (m *metrics) finished(reason string, e2e time.Duration) {
	m.mu.Lock()
	m.success[reason]++
	if reason != finishAbort {
		m.e2e.observe(e2e.Seconds())
	}
	m.mu.Unlock()
}

// write renders the Prometheus text exposition format (version 0.0.4).
func (m *metrics) write(out io.Writer, st Stats) error {
	w := bufio.NewWriter(out)
	label := `model_name="` + escapeLabel(m.model) + `"`
	gauge := func(name, help string, v float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s{%s} %s\n", name, help, name, name, label, formatFloat(v))
	}
	counter := func(name, help string, v uint64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s{%s} %d\n", name, help, name, name, label, v)
	}
	hist := func(name, help string, h *histogram) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
		var cum uint64
		for i, b := range h.bounds {
			cum += h.counts[i]
			fmt.Fprintf(w, "%s_bucket{%s,le=\"%s\"} %d\n", name, label, formatFloat(b), cum)
		}
		fmt.Fprintf(w, "%s_bucket{%s,le=\"+Inf\"} %d\n", name, label, h.count)
		fmt.Fprintf(w, "%s_sum{%s} %s\n%s_count{%s} %d\n", name, label, formatFloat(h.sum), name, label, h.count)
	}

	gauge("vllm:num_requests_running", "Number of requests in the running batch, over all replicas.", float64(st.Running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be scheduled, over all replicas.", float64(st.Waiting))
	gauge("vllm:gpu_cache_usage_perc", "KV cache usage: used blocks / total blocks over all replicas (1 means 100 percent).", st.CacheUsage)
	gauge("sluice_llmsim_replicas", "Replicas taking requests (draining replicas excluded).", float64(st.ActiveReplicas))
	gauge("sluice_llmsim_max_num_seqs", "Current max_num_seqs of each replica.", float64(st.MaxNumSeqs))
	gauge("sluice_llmsim_kv_cache_blocks", "KV cache blocks over all replicas, draining ones included.", float64(st.TotalBlocks))

	m.mu.Lock()
	defer m.mu.Unlock()
	counter("vllm:prompt_tokens_total", "Prompt tokens prefilled (counted once per request, recomputation excluded).", m.promptTotal)
	counter("vllm:generation_tokens_total", "Generated tokens.", m.generationTotal)
	counter("vllm:num_preemptions_total", "Sequences preempted because the KV cache was full.", m.preemptionsTotal)
	fmt.Fprintf(w, "# HELP vllm:request_success_total Finished requests by finish reason.\n# TYPE vllm:request_success_total counter\n")
	for _, reason := range []string{finishStop, finishLength, finishAbort} {
		fmt.Fprintf(w, "vllm:request_success_total{%s,finished_reason=\"%s\"} %d\n", label, reason, m.success[reason])
	}
	hist("vllm:time_to_first_token_seconds", "Time to first token in seconds (simulated time).", m.ttft)
	hist("vllm:e2e_request_latency_seconds", "End-to-end latency of finished requests in seconds (simulated time).", m.e2e)
	hist("vllm:time_per_output_token_seconds", "Time between consecutive output tokens in seconds (simulated time).", m.tpot)
	if err := w.Flush(); err != nil {
		return fmt.Errorf("write metrics: %w", err)
	}
	return nil
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func escapeLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}
