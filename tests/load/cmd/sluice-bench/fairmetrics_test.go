package main

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func nearAll(got, want []float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if !near(got[i], want[i]) {
			return false
		}
	}
	return true
}

// Three clients worked by hand over 40 s, ticks at 10, 20 and 30, 20 s
// windows, no warm-up:
//
//	a: arrives 0, 10 + 5 tokens (service 20), tokens from 0 to 20
//	b: arrives 0, 4 + 3 tokens (service 10), tokens from 20 to 30;
//	   arrives 25, 2 + 0 tokens (service 2), all at 25
//	c: arrives 5, 1 + 1 tokens (service 3), never served
func TestFairnessByHand(t *testing.T) {
	spec := fairSpec{span: 40, warmup: 0, window: 20, steps: 4}
	reqs := []fairReq{
		{client: "a", arrival: 0, prompt: 10, output: 5, served: true, first: 0, last: 20, gotPrompt: 10, gotOutput: 5},
		{client: "b", arrival: 0, prompt: 4, output: 3, served: true, first: 20, last: 30, gotPrompt: 4, gotOutput: 3},
		{client: "b", arrival: 25, prompt: 2, output: 0, served: true, first: 25, last: 25, gotPrompt: 2},
		{client: "c", arrival: 5, prompt: 1, output: 1},
	}
	res := measureFairness(reqs, spec)
	if !nearAll(res.ticks, []float64{10, 20, 30}) {
		t.Fatalf("ticks %v, want 10 20 30", res.ticks)
	}
	// Accumulated: a has 10, 20, 20; b 0, 0, 12; c always 0.
	if want := []float64{10, 20, 20}; !nearAll(res.accDiff, want) {
		t.Errorf("accumulated difference %v, want %v", res.accDiff, want)
	}
	// Window [0,20]: s = a 1, b 0, c 0; d = a 1, b 0.5, c 0.15 →
	// 0 + min(1, 0.5) + min(1, 0.15) = 0.65.
	// Window [10,30]: s = a 0.5, b 0.6, c 0; d = b 0.1 →
	// min(0.1, 0.5) + 0 + min(0.6, 0) = 0.1.
	// Window [20,40]: s = b 0.6; d = b 0.1 → 0.
	if want := []float64{0.65, 0.1, 0}; !nearAll(res.winDiff, want) {
		t.Errorf("windowed difference %v, want %v", res.winDiff, want)
	}
	if !near(res.maxDiff, 0.65) || !near(res.avgDiff, 0.25) {
		t.Errorf("Max Diff %v, Avg Diff %v; want 0.65, 0.25", res.maxDiff, res.avgDiff)
	}
	// 15 + 7 + 2 tokens over 40 s.
	if !near(res.throughput, 0.6) {
		t.Errorf("throughput %v, want 0.6", res.throughput)
	}
}

// A client served more than it asked for, but less than the best-served
// one, counts the nearer of the two gaps: |demand − service|, not a
// negative demand − service.
func TestWindowedDiffTakesTheNearerGap(t *testing.T) {
	got := windowedDiff([]float64{1, 0.8, 0.2}, []float64{2, 0.7, 0.3})
	if !near(got, 0.2) {
		t.Errorf("windowed difference %v, want 0 + min(0.2, 0.1) + min(0.8, 0.1) = 0.2", got)
	}
}

// Service is spread evenly between the first and the last token, and
// the warm-up is left out of the accumulation.
func TestAccumulationStartsAfterWarmup(t *testing.T) {
	spec := fairSpec{span: 130, warmup: 30, window: 20, steps: 2}
	reqs := []fairReq{
		// 100 + 2 × 50 = 200 of service from 0 to 100: 2 a second.
		{client: "a", prompt: 100, output: 50, served: true, first: 0, last: 100, gotPrompt: 100, gotOutput: 50},
		{client: "b", prompt: 1, output: 1},
	}
	res := measureFairness(reqs, spec)
	// One tick at 50: [30, 80] holds 50 s of a's 2/s.
	if !nearAll(res.ticks, []float64{50}) || !nearAll(res.accDiff, []float64{100}) {
		t.Errorf("ticks %v, accumulated difference %v; want [50], [100]", res.ticks, res.accDiff)
	}
	// Throughput: 150 tokens over 100 s, 70 of which in [30, 130].
	if !near(res.throughput, 150*0.7/100) {
		t.Errorf("throughput %v, want %v", res.throughput, 150*0.7/100)
	}
}

// The paper's readings: 19 ticks 28.5 s apart, the last at 541.5 s, whose
// accumulation ends at 571.5 s.
func TestPaperTicks(t *testing.T) {
	ticks := paperSpec.ticks()
	if len(ticks) != 19 || !near(ticks[0], 28.5) || !near(ticks[18], 541.5) {
		t.Errorf("ticks %v", ticks)
	}
}
