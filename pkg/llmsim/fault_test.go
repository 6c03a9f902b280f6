package llmsim_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/llmsim"
)

// liveStream is a streaming completion read as it arrives.
type liveStream struct {
	cancel context.CancelFunc
	// tokens gets each piece of content; it is closed when the stream
	// ends, and finish then holds the finish reason, if one came.
	tokens chan string
	finish string
}

// open starts a streaming completion and reads it in the background. Its
// headers must come back 200 at once, stalled or not.
func (s *testSim) open(t *testing.T, body map[string]any) *liveStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	body["stream"] = true
	resp, err := post(ctx, s.client, s.url+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	ls := &liveStream{cancel: cancel, tokens: make(chan string, 4096)}
	go func() {
		defer resp.Body.Close()
		defer close(ls.tokens)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			var c sseChunk
			if !ok || json.Unmarshal([]byte(data), &c) != nil || len(c.Choices) == 0 {
				continue
			}
			if ch := c.Choices[0]; ch.FinishReason != nil {
				ls.finish = *ch.FinishReason
			} else if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				ls.tokens <- *ch.Delta.Content
			}
		}
	}()
	return ls
}

// take waits for n tokens.
func (ls *liveStream) take(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case _, ok := <-ls.tokens:
			if !ok {
				t.Fatalf("stream ended after %d tokens, want %d", i, n)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d tokens, want %d", i, n)
		}
	}
}

// silent checks that no token comes for d (wall time; a step of the test
// config lasts well under a millisecond).
func (ls *liveStream) silent(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case tok, ok := <-ls.tokens:
		t.Fatalf("stream not stalled: token %q (open %v)", tok, ok)
	case <-time.After(d):
	}
}

// rest reads the stream to its end and returns how many tokens came.
func (ls *liveStream) rest(t *testing.T) int {
	t.Helper()
	n := 0
	timeout := time.After(20 * time.Second)
	for {
		select {
		case _, ok := <-ls.tokens:
			if !ok {
				return n
			}
			n++
		case <-timeout:
			t.Fatalf("stream did not end; %d tokens so far", n)
		}
	}
}

func TestNoFaultByDefault(t *testing.T) {
	if f := llmsim.DefaultConfig().Fault; f != (llmsim.Fault{}) {
		t.Fatalf("default fault %+v", f)
	}
	sim := start(t, testConfig())
	if got := sim.getConfig(t); got["fault"] == nil || len(got["fault"].(map[string]any)) != 0 || got["replica_faults"] != nil {
		t.Fatalf("GET /admin/config = %v, want an empty fault and no replica faults", got)
	}
}

func TestFaultStallFirstTokenHoldsTheSlot(t *testing.T) {
	sim := start(t, testConfig())
	if status, rc, raw := sim.setConfig(t, `{"fault": {"stall_first_token": true}}`); status != http.StatusOK || !rc.Fault.StallFirstToken {
		t.Fatalf("set fault: %d %s", status, raw)
	}
	ls := sim.open(t, map[string]any{"messages": userMsg("stalled")})
	ls.silent(t, 300*time.Millisecond)
	if st := sim.Stats(); st.Running != 1 || st.UsedBlocks == 0 {
		t.Fatalf("a stalled request must hold its slot and blocks: %+v", st)
	}
	// Only the client giving up frees them.
	ls.cancel()
	sim.waitFor(t, "the stalled request aborted", func(st llmsim.Stats) bool { return st.Running == 0 && st.UsedBlocks == 0 })

	if status, _, raw := sim.setConfig(t, `{"fault": {}}`); status != http.StatusOK {
		t.Fatalf("clear fault: %d %s", status, raw)
	}
	if res, err := sim.streamChat(context.Background(), map[string]any{"messages": userMsg("healed"), "max_tokens": 5}); err != nil || res.Chunks != 5 {
		t.Fatalf("after the fault is cleared: %+v %v", res, err)
	}
}

func TestFaultStallMidStreamResumesWhenCleared(t *testing.T) {
	sim := start(t, testConfig())
	if status, _, raw := sim.setConfig(t, `{"fault": {"stall_after_tokens": 3}}`); status != http.StatusOK {
		t.Fatalf("set fault: %d %s", status, raw)
	}
	ls := sim.open(t, map[string]any{"messages": userMsg("mid-stream stall"), "max_tokens": 10})
	ls.take(t, 3)
	ls.silent(t, 300*time.Millisecond)
	// A transient hang: the engine carries on where it stopped.
	if status, _, raw := sim.setConfig(t, `{"fault": {}}`); status != http.StatusOK {
		t.Fatalf("clear fault: %d %s", status, raw)
	}
	if n := ls.rest(t); n != 7 || ls.finish != "length" {
		t.Fatalf("after the stall: %d more tokens, finish %q; want 7 and length", n, ls.finish)
	}
}

func TestFaultErrorStatus(t *testing.T) {
	sim := start(t, testConfig())
	for _, status := range []int{500, 503} {
		if code, _, raw := sim.setConfig(t, `{"fault": {"error_status": `+strconv.Itoa(status)+`}}`); code != http.StatusOK {
			t.Fatalf("set fault: %d %s", code, raw)
		}
		resp, err := post(context.Background(), sim.client, sim.url+"/v1/chat/completions",
			map[string]any{"messages": userMsg("refused"), "stream": true})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status || !strings.Contains(string(b), `"type":"server_error"`) {
			t.Errorf("fault %d: got %d %s", status, resp.StatusCode, b)
		}
	}
	if st := sim.Stats(); st.Running+st.Waiting != 0 {
		t.Errorf("refused requests were queued: %+v", st)
	}
}

func TestFaultOfOneReplica(t *testing.T) {
	cfg := testConfig()
	cfg.Replicas = 2
	// Long enough that the healthy answer is still running when the
	// second request arrives, so the two land on different replicas.
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 400, 400
	sim := start(t, cfg)
	if status, rc, raw := sim.setConfig(t, `{"replica_faults": {"0": {"stall_first_token": true}}}`); status != http.StatusOK ||
		!rc.ReplicaFaults[0].StallFirstToken || rc.Fault.StallFirstToken {
		t.Fatalf("set replica fault: %d %s", status, raw)
	}
	a := sim.open(t, map[string]any{"messages": userMsg("first")})
	sim.waitFor(t, "the first request running", func(st llmsim.Stats) bool { return st.Running == 1 })
	b := sim.open(t, map[string]any{"messages": userMsg("second")})
	st := sim.waitFor(t, "one answer done", func(st llmsim.Stats) bool { return st.Replicas[1].Completed == 1 })
	if st.Replicas[0].Running != 1 || st.Replicas[0].Completed != 0 {
		t.Fatalf("replica 0 should hold the stalled request: %+v", st.Replicas)
	}
	if got := sim.getConfig(t)["replica_faults"]; got == nil {
		t.Fatal("GET /admin/config lacks the replica's fault")
	}
	// Giving replica 0 back to the server-wide fault (none) lets its
	// request finish.
	if status, _, raw := sim.setConfig(t, `{"replica_faults": {"0": null}}`); status != http.StatusOK {
		t.Fatalf("clear replica fault: %d %s", status, raw)
	}
	if na, nb := a.rest(t), b.rest(t); na+nb != 800 {
		t.Fatalf("tokens %d + %d, want both whole answers", na, nb)
	}
}

func TestFaultSlowReplica(t *testing.T) {
	// tpot is the mean simulated time per output token of one answer.
	tpot := func(delay time.Duration) float64 {
		cfg := testConfig()
		cfg.Fault.TokenDelay = delay
		sim := start(t, cfg)
		if _, err := sim.streamChat(context.Background(), map[string]any{"messages": userMsg("slow"), "max_tokens": 30}); err != nil {
			t.Fatal(err)
		}
		vals, _ := sim.scrape(t)
		l := `{model_name="sluice-sim"}`
		return vals["vllm:time_per_output_token_seconds_sum"+l] / vals["vllm:time_per_output_token_seconds_count"+l]
	}
	healthy, slow := tpot(0), tpot(100*time.Millisecond)
	// Timers that wake late shift single gaps, not the mean by much.
	if extra := slow - healthy; extra < 0.07 || extra > 0.13 {
		t.Fatalf("time per output token %vs healthy, %vs slow: want about 0.1s more", healthy, slow)
	}
}

func TestFaultRefusals(t *testing.T) {
	sim := start(t, testConfig())
	for body, want := range map[string]string{
		`{"fault": {"error_status": 404}}`:                                "error_status must be 0 or 500..599, got 404",
		`{"fault": {"stall_after_tokens": -1}}`:                           "stall_after_tokens must be >= 0, got -1",
		`{"fault": {"stall_first_token": true, "stall_after_tokens": 2}}`: "set stall_first_token or stall_after_tokens, not both",
		`{"fault": {"token_delay_seconds": -1}}`:                          "token_delay must be in 0..1m0s, got -1s",
		`{"fault": {"stall": true}}`:                                      `unknown field "stall"`,
		`{"replica_faults": {"7": {"error_status": 500}}}`:                "replica_faults: no replica 7",
	} {
		status, _, raw := sim.setConfig(t, body)
		var e struct {
			Error struct{ Message, Type string }
		}
		_ = json.Unmarshal([]byte(raw), &e)
		if status != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, want) {
			t.Errorf("POST %s: %d %s, want 400 with %q", body, status, raw, want)
		}
	}
	if got := sim.getConfig(t); len(got["fault"].(map[string]any)) != 0 || got["replica_faults"] != nil {
		t.Errorf("faults changed by refused updates: %v", got)
	}
	cfg := testConfig()
	cfg.Fault.ErrorStatus = 200
	if _, err := llmsim.New(cfg, nil); err == nil || !strings.Contains(err.Error(), "Fault: error_status must be 0 or 500..599, got 200") {
		t.Fatalf("New with a bad fault: %v", err)
	}
}
