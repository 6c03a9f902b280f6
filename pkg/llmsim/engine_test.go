package llmsim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/llmsim"
)

func TestBatchNeverExceedsMaxNumSeqs(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 3
	sim := start(t, cfg)
	stop := make(chan struct{})
	samples := sim.monitor(stop)
	results, err := sim.parallel(context.Background(), 10, func(i int) map[string]any {
		return map[string]any{"messages": userMsg(fmt.Sprintf("question %d about batching", i)), "max_tokens": 40}
	})
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	maxRunning, maxWaiting := 0, 0
	for _, st := range <-samples {
		maxRunning = max(maxRunning, st.Running)
		maxWaiting = max(maxWaiting, st.Waiting)
	}
	if maxRunning > 3 {
		t.Errorf("running reached %d with MaxNumSeqs=3", maxRunning)
	}
	if maxRunning < 2 || maxWaiting == 0 {
		t.Errorf("max running %d, max waiting %d: want a full batch and a queue", maxRunning, maxWaiting)
	}
	for i, r := range results {
		if r.Finish != "length" || r.Chunks != 40 {
			t.Errorf("request %d: %+v", i, r)
		}
	}
}

func TestKVCacheUsage(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 4
	// Long enough that the first request still runs when the last joins.
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 1000, 1000
	cfg.DefaultMaxTokens = 2000
	sim := start(t, cfg)
	ctx := context.Background()
	done := make(chan error, 4)
	run := func(i int) {
		_, err := sim.streamChat(ctx, map[string]any{"messages": userMsg(fmt.Sprintf("kv question %d", i))})
		done <- err
	}

	go run(0)
	one := sim.waitFor(t, "one running", func(st llmsim.Stats) bool { return st.Running == 1 })
	for i := 1; i < 4; i++ {
		go run(i)
	}
	four := sim.waitFor(t, "four running", func(st llmsim.Stats) bool { return st.Running == 4 })
	if one.UsedBlocks < 1 || four.UsedBlocks <= one.UsedBlocks {
		t.Errorf("used blocks with 1 running %d, with 4 running %d: want growth", one.UsedBlocks, four.UsedBlocks)
	}
	if want := float64(four.UsedBlocks) / float64(four.TotalBlocks); four.CacheUsage != want || want <= 0 || want > 1 {
		t.Errorf("cache usage %v, want used/total = %v", four.CacheUsage, want)
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	end := sim.waitFor(t, "all finished", func(st llmsim.Stats) bool { return st.Running == 0 })
	if end.UsedBlocks != 0 || end.CacheUsage != 0 || end.Waiting != 0 {
		t.Errorf("after all finished: %+v, want an empty cache", end)
	}
}

func TestPreemptionWhenKVCacheIsTight(t *testing.T) {
	// 16 blocks of 4 tokens: five prompts of about 12 tokens fit, but one
	// answer of 40 tokens takes 13 blocks, so any two overlapping requests
	// outgrow the cache.
	cfg := testConfig()
	cfg.KVCacheBlocks = 16
	cfg.BlockSize = 4
	cfg.MaxNumSeqs = 8
	sim := start(t, cfg)
	roomy := start(t, testConfig())
	ctx := context.Background()
	body := func(i int) map[string]any {
		return map[string]any{"messages": userMsg(fmt.Sprintf("tight cache question %d", i)), "max_tokens": 40}
	}
	results, err := sim.parallel(ctx, 6, body)
	if err != nil {
		t.Fatal(err)
	}
	st := sim.Stats()
	if st.Preemptions == 0 {
		t.Errorf("no preemption with a 16-block cache and 6 requests")
	}
	if st.UsedBlocks != 0 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("after all finished: %+v", st)
	}
	for i, r := range results {
		if r.Finish != "length" || r.Chunks != 40 || r.Usage.CompletionTokens != 40 {
			t.Errorf("request %d: finish %q, %d chunks, usage %+v; want length, 40, 40", i, r.Finish, r.Chunks, r.Usage)
		}
		// Recompute preemption resumes where the stream stopped: the text is
		// what an unpreempted run produces.
		want, err := roomy.streamChat(ctx, body(i))
		if err != nil {
			t.Fatal(err)
		}
		if r.Text != want.Text {
			t.Errorf("request %d: preempted text %q differs from %q", i, r.Text, want.Text)
		}
	}
	vals, _ := sim.scrape(t)
	if v := vals[`vllm:num_preemptions_total{model_name="sluice-sim"}`]; v != float64(st.Preemptions) {
		t.Errorf("vllm:num_preemptions_total = %v, want %d", v, st.Preemptions)
	}
}

// tailConfig makes the batch-size cost of a step visible: 300-token answers
// for long requests, 30-token budgets for short ones.
func tailConfig(mode string) llmsim.Config {
	cfg := testConfig()
	// Slow enough that simulated time, not HTTP and scheduling overhead,
	// makes up the latencies compared: at 0.05 a short request took ~40 ms
	// of which the model was a few, and a busy machine (go test runs
	// packages in parallel) inflated one side of the ratio by 2x.
	cfg.TimeScale = 0.25
	cfg.Mode = mode
	cfg.MaxNumSeqs = 6
	cfg.DecodeBase = 10 * time.Millisecond
	cfg.DecodePerSeq = 2 * time.Millisecond
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 300, 300
	cfg.DefaultMaxTokens = 1000
	return cfg
}

// shortLatencies runs 8 short requests, after 4 long ones are in the system
// if withLong, and returns the short requests' latencies.
func shortLatencies(t *testing.T, mode string, withLong bool) []time.Duration {
	t.Helper()
	sim := start(t, tailConfig(mode))
	ctx := context.Background()
	longDone := make(chan error, 1)
	if withLong {
		go func() {
			results, err := sim.parallel(ctx, 4, func(i int) map[string]any {
				return map[string]any{"messages": userMsg(fmt.Sprintf("long report %d", i))}
			})
			for _, r := range results {
				if err == nil && r.Chunks != 300 {
					err = fmt.Errorf("long request produced %d tokens, want 300", r.Chunks)
				}
			}
			longDone <- err
		}()
		sim.waitFor(t, "long requests queued", func(st llmsim.Stats) bool { return st.Running+st.Waiting == 4 })
	}
	results, err := sim.parallel(ctx, 8, func(i int) map[string]any {
		return map[string]any{"messages": userMsg(fmt.Sprintf("short question %d", i)), "max_tokens": 30}
	})
	if err != nil {
		t.Fatal(err)
	}
	if withLong {
		if err := <-longDone; err != nil {
			t.Fatal(err)
		}
	}
	out := make([]time.Duration, len(results))
	for i, r := range results {
		if r.Chunks != 30 {
			t.Fatalf("short request %d produced %d tokens", i, r.Chunks)
		}
		out[i] = r.Latency
	}
	return out
}

func TestLongRequestsInflateShortLatency(t *testing.T) {
	alone := mean(shortLatencies(t, llmsim.ModeContinuous, false))
	mixed := mean(shortLatencies(t, llmsim.ModeContinuous, true))
	t.Logf("continuous: short requests alone %v, mixed with long ones %v", alone, mixed)
	// The model predicts about 2x (bigger batches, and only 2 free slots).
	if float64(mixed) < 1.3*float64(alone) {
		t.Errorf("short requests mixed with long ones took %v on average, alone %v: want clearly slower", mixed, alone)
	}
}

func TestStaticBatchingMakesShortRequestsWait(t *testing.T) {
	continuous := mean(shortLatencies(t, llmsim.ModeContinuous, true))
	static := mean(shortLatencies(t, llmsim.ModeStatic, true))
	t.Logf("short requests behind long ones: continuous %v, static %v", continuous, static)
	// In static mode a short request cannot start before the long batch
	// has finished all 300 tokens: the model predicts 3x or more.
	if float64(static) < 2*float64(continuous) {
		t.Errorf("static batching: short requests took %v on average, continuous %v: want much slower", static, continuous)
	}
}

func TestStaticBatchAdmitsNobodyUntilItEnds(t *testing.T) {
	cfg := tailConfig(llmsim.ModeStatic)
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 500, 500
	sim := start(t, cfg)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := sim.streamChat(ctx, map[string]any{"messages": userMsg("first")})
		first <- err
	}()
	sim.waitFor(t, "first batch running", func(st llmsim.Stats) bool { return st.Running == 1 })
	second := make(chan error, 1)
	go func() {
		_, err := sim.streamChat(ctx, map[string]any{"messages": userMsg("second"), "max_tokens": 5})
		second <- err
	}()
	st := sim.waitFor(t, "second request queued", func(st llmsim.Stats) bool { return st.Waiting == 1 })
	if st.Running != 1 {
		t.Errorf("static batch let a request join: %+v", st)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
}

func TestClientDisconnectFreesBlocks(t *testing.T) {
	cfg := testConfig()
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 5000, 5000
	cfg.DefaultMaxTokens = 10000
	sim := start(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := post(ctx, sim.client, sim.url+"/v1/chat/completions", map[string]any{
		"messages": userMsg("a very long answer please"), "stream": true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1024)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatalf("read first chunk: %v", err)
	}
	st := sim.waitFor(t, "request running", func(st llmsim.Stats) bool { return st.Running == 1 })
	if st.UsedBlocks == 0 {
		t.Fatalf("running request holds no blocks: %+v", st)
	}
	cancel()
	sim.waitFor(t, "aborted request to free its blocks", func(st llmsim.Stats) bool {
		return st.Running == 0 && st.Waiting == 0 && st.UsedBlocks == 0
	})
	vals, _ := sim.scrape(t)
	if v := vals[`vllm:request_success_total{model_name="sluice-sim",finished_reason="abort"}`]; v != 1 {
		t.Errorf("abort count = %v, want 1", v)
	}
	if v := vals[`vllm:request_success_total{model_name="sluice-sim",finished_reason="stop"}`]; v != 0 {
		t.Errorf("stop count = %v, want 0", v)
	}
}

func TestCloseAbortsInFlight(t *testing.T) {
	cfg := testConfig()
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 5000, 5000
	cfg.DefaultMaxTokens = 10000
	sim := start(t, cfg)
	ctx := context.Background()
	errc := make(chan error, 2)
	go func() {
		_, err := sim.streamChat(ctx, map[string]any{"messages": userMsg("stream me")})
		errc <- err
	}()
	go func() {
		_, err := sim.chat(ctx, map[string]any{"messages": userMsg("wait for me")})
		errc <- err
	}()
	sim.waitFor(t, "both running", func(st llmsim.Stats) bool { return st.Running == 2 })
	sim.Close()
	for range 2 {
		if err := <-errc; err == nil {
			t.Error("request completed although the simulator closed")
		}
	}
	if _, err := sim.chat(ctx, map[string]any{"messages": userMsg("too late")}); err == nil {
		t.Error("closed simulator accepted a request")
	}
}
