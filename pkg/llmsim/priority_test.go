package llmsim_test

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/pkg/llmsim"
)

// Given vLLM's priority, the waiting queue is ordered by it, lower
// first, as vLLM's priority scheduling orders it: a later request of
// priority -1 is admitted before an earlier one of priority 1.
func TestWaitingQueueOrderedByPriority(t *testing.T) {
	cfg := testConfig()
	cfg.Replicas, cfg.MaxNumSeqs = 1, 1
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = 30, 30
	sim := start(t, cfg)
	ctx := context.Background()
	finished := make(chan string, 3)
	run := func(name string, priority *int) {
		body := map[string]any{"messages": userMsg("priority question " + name), "max_tokens": 30}
		if priority != nil {
			body["priority"] = *priority
		}
		if _, err := sim.streamChat(ctx, body); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		finished <- name
	}
	low, high := 1, -1
	go run("first", nil)
	sim.waitFor(t, "the first running", func(st llmsim.Stats) bool { return st.Running == 1 })
	go run("low", &low)
	sim.waitFor(t, "low waiting", func(st llmsim.Stats) bool { return st.Waiting == 1 })
	go run("high", &high)
	sim.waitFor(t, "both waiting", func(st llmsim.Stats) bool { return st.Waiting == 2 })
	var order []string
	for range 3 {
		order = append(order, <-finished)
	}
	if order[0] != "first" || order[1] != "high" || order[2] != "low" {
		t.Fatalf("finished in order %v, want first, high, low", order)
	}
}
