package vtc

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
	spec := Spec{Span: 40, Warmup: 0, Window: 20, Steps: 4}
	reqs := []Req{
		{Client: "a", Arrival: 0, Prompt: 10, Output: 5, Served: true, First: 0, Last: 20, GotPrompt: 10, GotOutput: 5},
		{Client: "b", Arrival: 0, Prompt: 4, Output: 3, Served: true, First: 20, Last: 30, GotPrompt: 4, GotOutput: 3},
		{Client: "b", Arrival: 25, Prompt: 2, Output: 0, Served: true, First: 25, Last: 25, GotPrompt: 2},
		{Client: "c", Arrival: 5, Prompt: 1, Output: 1},
	}
	res := Measure(reqs, spec)
	if !nearAll(res.Ticks, []float64{10, 20, 30}) {
		t.Fatalf("ticks %v, want 10 20 30", res.Ticks)
	}
	// Accumulated: a has 10, 20, 20; b 0, 0, 12; c always 0.
	if want := []float64{10, 20, 20}; !nearAll(res.AccDiff, want) {
		t.Errorf("accumulated difference %v, want %v", res.AccDiff, want)
	}
	// Window [0,20]: s = a 1, b 0, c 0; d = a 1, b 0.5, c 0.15 →
	// 0 + min(1, 0.5) + min(1, 0.15) = 0.65.
	// Window [10,30]: s = a 0.5, b 0.6, c 0; d = b 0.1 →
	// min(0.1, 0.5) + 0 + min(0.6, 0) = 0.1.
	// Window [20,40]: s = b 0.6; d = b 0.1 → 0.
	if want := []float64{0.65, 0.1, 0}; !nearAll(res.WinDiff, want) {
		t.Errorf("windowed difference %v, want %v", res.WinDiff, want)
	}
	if !near(res.MaxDiff, 0.65) || !near(res.AvgDiff, 0.25) {
		t.Errorf("Max Diff %v, Avg Diff %v; want 0.65, 0.25", res.MaxDiff, res.AvgDiff)
	}
	// 15 + 7 + 2 tokens over 40 s.
	if !near(res.Throughput, 0.6) {
		t.Errorf("throughput %v, want 0.6", res.Throughput)
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
	spec := Spec{Span: 130, Warmup: 30, Window: 20, Steps: 2}
	reqs := []Req{
		// 100 + 2 × 50 = 200 of service from 0 to 100: 2 a second.
		{Client: "a", Prompt: 100, Output: 50, Served: true, First: 0, Last: 100, GotPrompt: 100, GotOutput: 50},
		{Client: "b", Prompt: 1, Output: 1},
	}
	res := Measure(reqs, spec)
	// One tick at 50: [30, 80] holds 50 s of a's 2/s.
	if !nearAll(res.Ticks, []float64{50}) || !nearAll(res.AccDiff, []float64{100}) {
		t.Errorf("ticks %v, accumulated difference %v; want [50], [100]", res.Ticks, res.AccDiff)
	}
	// Throughput: 150 tokens over 100 s, 70 of which in [30, 130].
	if !near(res.Throughput, 150*0.7/100) {
		t.Errorf("throughput %v, want %v", res.Throughput, 150*0.7/100)
	}
}

// The paper's readings: 19 ticks 28.5 s apart, the last at 541.5 s, whose
// accumulation ends at 571.5 s.
func TestPaperTicks(t *testing.T) {
	ticks := PaperSpec.Ticks()
	if len(ticks) != 19 || !near(ticks[0], 28.5) || !near(ticks[18], 541.5) {
		t.Errorf("ticks %v", ticks)
	}
}
