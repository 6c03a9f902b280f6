package llmsim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/llmsim"
)

func (s *testSim) setConfig(t *testing.T, body string) (int, llmsim.RuntimeConfig, string) {
	t.Helper()
	resp, err := s.client.Post(s.url+"/admin/config", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatalf("decode admin response: %v", err)
	}
	var rc llmsim.RuntimeConfig
	_ = json.Unmarshal(raw, &rc)
	return resp.StatusCode, rc, string(raw)
}

func (s *testSim) getConfig(t *testing.T) map[string]any {
	t.Helper()
	resp, err := s.client.Get(s.url + "/admin/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestAdminLowersMaxNumSeqs(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 8
	// The first batch runs long enough to watch the second one queue.
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 1000, 1000
	cfg.DefaultMaxTokens = 2000
	sim := start(t, cfg)
	ctx := context.Background()
	body := func(i int) map[string]any {
		return map[string]any{"messages": userMsg(fmt.Sprintf("admission %d", i))}
	}
	firstDone := make(chan error, 1)
	go func() {
		_, err := sim.parallel(ctx, 8, body)
		firstDone <- err
	}()
	sim.waitFor(t, "full batch", func(st llmsim.Stats) bool { return st.Running == 8 })

	status, rc, raw := sim.setConfig(t, `{"max_num_seqs": 2}`)
	if status != http.StatusOK || rc.MaxNumSeqs != 2 {
		t.Fatalf("lower max_num_seqs: %d %s", status, raw)
	}
	if got := sim.getConfig(t)["max_num_seqs"]; got != 2.0 {
		t.Errorf("GET /admin/config max_num_seqs = %v, want 2", got)
	}

	stop := make(chan struct{})
	samples := sim.monitor(stop)
	secondDone := make(chan error, 1)
	go func() {
		results, err := sim.parallel(ctx, 6, func(i int) map[string]any {
			b := body(100 + i)
			b["max_tokens"] = 20
			return b
		})
		for _, r := range results {
			if err == nil && r.Chunks != 20 {
				err = fmt.Errorf("late request ended with %q", r.Finish)
			}
		}
		secondDone <- err
	}()
	st := sim.waitFor(t, "new requests queued", func(st llmsim.Stats) bool { return st.Waiting == 6 })
	// Lowering the limit never kills running sequences.
	if st.Running == 0 {
		t.Errorf("running batch vanished after lowering max_num_seqs: %+v", st)
	}
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if err := <-secondDone; err != nil {
		t.Fatal(err)
	}
	close(stop)
	prev := -1
	for _, s := range <-samples {
		// The batch may only grow (by admission) up to the new limit.
		if prev >= 0 && s.Running > prev && s.Running > 2 {
			t.Fatalf("running grew from %d to %d with max_num_seqs=2", prev, s.Running)
		}
		prev = s.Running
	}
}

func TestAdminChangesReplicas(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 2
	// Long enough that requests are still running while replicas drain.
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 1000, 1000
	cfg.DefaultMaxTokens = 2000
	sim := start(t, cfg)
	ctx := context.Background()

	status, rc, raw := sim.setConfig(t, `{"replicas": 3}`)
	if status != http.StatusOK || rc.Replicas != 3 {
		t.Fatalf("scale up: %d %s", status, raw)
	}
	if st := sim.Stats(); st.ActiveReplicas != 3 || len(st.Replicas) != 3 || st.TotalBlocks != 3*cfg.KVCacheBlocks {
		t.Fatalf("after scale up: %+v", st)
	}

	done := make(chan error, 1)
	go func() {
		results, err := sim.parallel(ctx, 6, func(i int) map[string]any {
			return map[string]any{"messages": userMsg(fmt.Sprintf("replica %d", i))}
		})
		for _, r := range results {
			if err == nil && (r.Finish != "stop" || r.Chunks != 1000) {
				err = fmt.Errorf("request on a drained replica ended early: %+v", r)
			}
		}
		done <- err
	}()
	st := sim.waitFor(t, "six running", func(st llmsim.Stats) bool { return st.Running == 6 })
	for _, r := range st.Replicas {
		if r.Running != 2 {
			t.Errorf("replica %d runs %d, want requests spread 2 per replica", r.ID, r.Running)
		}
	}

	status, rc, raw = sim.setConfig(t, `{"replicas": 1}`)
	if status != http.StatusOK || rc.Replicas != 1 || rc.DrainingReplicas != 2 {
		t.Fatalf("scale down: %d %s", status, raw)
	}
	st = sim.Stats()
	if st.ActiveReplicas != 1 || st.Running != 6 {
		t.Errorf("draining must keep running requests: %+v", st)
	}
	// New work goes only to the replica that stays.
	res, err := sim.streamChat(ctx, map[string]any{"messages": userMsg("after scale down"), "max_tokens": 3})
	if err != nil || res.Chunks != 3 {
		t.Fatalf("request after scale down: %+v, %v", res, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st = sim.waitFor(t, "drained replicas to stop", func(st llmsim.Stats) bool { return len(st.Replicas) == 1 })
	if st.Replicas[0].ID != 0 || st.Replicas[0].Completed != 3 || st.TotalBlocks != cfg.KVCacheBlocks {
		t.Errorf("remaining replica: %+v", st)
	}
	if got := sim.getConfig(t); got["replicas"] != 1.0 || got["draining_replicas"] != 0.0 {
		t.Errorf("GET /admin/config = %v", got)
	}
}

func TestAdminRejectsBadValues(t *testing.T) {
	sim := start(t, testConfig())
	for _, body := range []string{
		`{"max_num_seqs": 0}`,
		`{"max_num_seqs": -4}`,
		`{"replicas": 0}`,
		`{"replicas": 1000}`,
		`{"max_num_seq": 4}`,
		`{}`,
		`not json`,
	} {
		status, _, raw := sim.setConfig(t, body)
		if status != http.StatusBadRequest || !strings.Contains(raw, "invalid_request_error") {
			t.Errorf("POST %s: %d %s, want 400 invalid_request_error", body, status, raw)
		}
	}
	if got := sim.getConfig(t); got["max_num_seqs"] != 16.0 || got["replicas"] != 1.0 || got["mode"] != "continuous" {
		t.Errorf("config changed by refused updates: %v", got)
	}
}

func TestMetrics(t *testing.T) {
	sim := start(t, testConfig())
	ctx := context.Background()
	results, err := sim.parallel(ctx, 3, func(i int) map[string]any {
		return map[string]any{"messages": userMsg(fmt.Sprintf("metrics %d", i))}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.streamChat(ctx, map[string]any{"messages": userMsg("cut short"), "max_tokens": 2}); err != nil {
		t.Fatal(err)
	}
	prompt, completion := 0, 2
	for _, r := range results {
		prompt += r.Usage.PromptTokens
		completion += r.Usage.CompletionTokens
	}
	vals, raw := sim.scrape(t)
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
		"vllm:request_success_total", "vllm:time_to_first_token_seconds",
		"vllm:e2e_request_latency_seconds", "vllm:time_per_output_token_seconds",
	} {
		if !strings.Contains(raw, "# TYPE "+name+" ") {
			t.Errorf("metrics lack %s", name)
		}
	}
	l := `{model_name="sluice-sim"}`
	want := map[string]float64{
		"vllm:num_requests_running" + l:                                                0,
		"vllm:num_requests_waiting" + l:                                                0,
		"vllm:gpu_cache_usage_perc" + l:                                                0,
		"vllm:num_preemptions_total" + l:                                               0,
		"vllm:generation_tokens_total" + l:                                             float64(completion),
		`vllm:request_success_total{model_name="sluice-sim",finished_reason="stop"}`:   3,
		`vllm:request_success_total{model_name="sluice-sim",finished_reason="length"}`: 1,
		"vllm:time_to_first_token_seconds_count" + l:                                   4,
		"vllm:e2e_request_latency_seconds_count" + l:                                   4,
		"vllm:time_per_output_token_seconds_count" + l:                                 float64(completion - 4),
		`vllm:e2e_request_latency_seconds_bucket{model_name="sluice-sim",le="+Inf"}`:   4,
	}
	for k, v := range want {
		if got, ok := vals[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	if got := vals["vllm:prompt_tokens_total"+l]; got < float64(prompt) {
		t.Errorf("prompt tokens total %v, want at least %d", got, prompt)
	}
	// Simulated decode steps take 15ms or more, so inter-token time is at
	// least that and TTFT is positive.
	if tpot := vals["vllm:time_per_output_token_seconds_sum"+l] / float64(completion-4); tpot < 0.014 || tpot > 1 {
		t.Errorf("mean time per output token %vs, want about 0.015-0.02", tpot)
	}
	if ttft := vals["vllm:time_to_first_token_seconds_sum"+l]; ttft <= 0 {
		t.Errorf("TTFT sum %v, want > 0", ttft)
	}
}
