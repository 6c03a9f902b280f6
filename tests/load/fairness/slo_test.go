package fairness

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
)

// Attainment counts every arrival of the window, the refused, timed out
// and dropped as misses, and judges each answer by its own tier's TTFT
// and pace; goodput is the answers within SLO per second of the window.
func TestSLOAttainmentAndGoodput(t *testing.T) {
	at := time.Now()
	done := func(tier int, ttft time.Duration, tokens int, last time.Duration) *sloArrival {
		return &sloArrival{tier: tier, at: at, inWindow: true, res: chat.Result{Kind: chat.KindDone, TTFT: ttft, Last: last, Tokens: tokens, Served: 100}}
	}
	ended := func(tier int, kind string) *sloArrival {
		return &sloArrival{tier: tier, at: at, inWindow: true, res: chat.Result{Kind: kind}}
	}
	warm := done(slo.Interactive, 100*time.Millisecond, 10, time.Second)
	warm.inWindow = false
	dropped := ended(slo.Interactive, "")
	dropped.dropped = true
	all := []*sloArrival{
		done(slo.Interactive, 500*time.Millisecond, 10, 1400*time.Millisecond),  // 100 ms a token: met
		done(slo.Interactive, 1500*time.Millisecond, 10, 2000*time.Millisecond), // first token late
		done(slo.Interactive, 200*time.Millisecond, 10, 2200*time.Millisecond),  // 222 ms a token: late
		ended(slo.Interactive, "rejected queue_timeout"),
		ended(slo.Interactive, "HTTP 503 busy"),
		ended(slo.Interactive, chat.KindHang),
		dropped,
		warm,
		done(slo.Batch, 30*time.Second, 10, 40*time.Second), // 1.1 s a token: batch has no pace bound
		done(slo.Batch, 61*time.Second, 10, 62*time.Second),
	}
	in := summarize(all, slo.Interactive)
	want := map[string]int{outMet: 1, outLate: 2, outRefused: 2, outTimedOut: 1, outDropped: 1}
	if in.arrivals != 7 || len(in.outcomes) != len(want) {
		t.Fatalf("interactive: %d arrivals, outcomes %v; want 7, %v", in.arrivals, in.outcomes, want)
	}
	for k, n := range want {
		if in.outcomes[k] != n {
			t.Errorf("interactive %s: %d, want %d", k, in.outcomes[k], n)
		}
	}
	if a := in.attainment(); a != 1.0/7 {
		t.Errorf("interactive attainment %v, want 1/7", a)
	}
	if g := in.goodput(10 * time.Second); g != 0.1 {
		t.Errorf("interactive goodput %v/s, want 0.1/s", g)
	}
	if len(in.ttft) != 3 || in.ttft.At(99) != 1500*time.Millisecond || len(in.tpot) != 3 {
		t.Errorf("interactive TTFT %v, TPOT %v: want the three answers'", in.ttft, in.tpot)
	}
	every := summarize(all, -1)
	if every.arrivals != 9 || every.outcomes[outMet] != 2 || every.attainment() != 2.0/9 {
		t.Errorf("all tiers: %d arrivals, %v", every.arrivals, every.outcomes)
	}
}

// Tokens count for the looks that found both tiers waiting, at the first
// token of each answer; the goals compare the modes at 2× and 1×.
func TestSLOSharesAndGoals(t *testing.T) {
	t0 := time.Now()
	ans := func(tier int, at time.Time, ttft time.Duration, served int) *sloArrival {
		return &sloArrival{tier: tier, at: at, inWindow: true, res: chat.Result{Kind: chat.KindDone, TTFT: ttft, Last: ttft + time.Second, Tokens: 50, Served: served}}
	}
	all := []*sloArrival{
		ans(slo.Interactive, t0, 200*time.Millisecond, 500), // in the first look's period
		ans(slo.Batch, t0, 400*time.Millisecond, 100),
		ans(slo.Batch, t0, 700*time.Millisecond, 100), // in the second, which found batch alone
	}
	samples := []backlogSample{
		{at: t0.Add(500 * time.Millisecond), waiting: [2]bool{true, true}},
		{at: t0.Add(time.Second), waiting: [2]bool{false, true}},
	}
	tok, both := backloggedTokens(all, samples, 500*time.Millisecond)
	if both != 1 || tok[slo.Interactive] != 500 || tok[slo.Batch] != 100 {
		t.Fatalf("tokens %v over %d looks; want [500 100] over 1", tok, both)
	}
	if w := weightedShare(slo.Batch); w != 1.0/6 {
		t.Errorf("batch's weighted share %v, want 1/6", w)
	}
	step := func(mode string, mult float64, ttft time.Duration, n int) *sloStep {
		s := &sloStep{mode: mode, mult: mult, window: 10 * time.Second, samples: samples}
		for range n {
			s.all = append(s.all, ans(slo.Interactive, t0, ttft, 100))
		}
		return s
	}
	s := &sloScenario{modeList: []string{modeHealOff, modeFCFS}, sampleEvery: 500 * time.Millisecond, steps: []*sloStep{
		step(modeHealOff, 2, 100*time.Millisecond, 10), step(modeFCFS, 2, 3*time.Second, 10),
		step(modeHealOff, 1, 100*time.Millisecond, 8), step(modeFCFS, 1, 100*time.Millisecond, 10),
	}}
	r := &report.Report{Name: "slo"}
	s.goals(r, modeHealOff)
	text := strings.Join(r.Lines, "\n")
	for _, want := range []string{
		"interactive attainment at 2×: 100.0% (goal >= 90%) — met",
		"FCFS's over Sluice's: 30.00× (FCFS 3.00 s over the 10 of 10 arrivals with a first token, Sluice 100 ms over 10 of 10) (goal >= 1.5×) — met",
		"total goodput at 1×, Sluice's over FCFS's: 0.80× (Sluice 0.80/s, FCFS 1.00/s) (goal >= 0.9×) — MISSED",
		"the tokens while both tiers were backlogged (every step): 0.0% over 2 looks",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("goals\n%s\nwant a line with %q", text, want)
		}
	}
}

// The ceiling's scheduler: interactive first, each free sequence to the
// oldest interactive request that can still meet its TTFT.
func TestIdealInteractive(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms int, tier int) *sloArrival {
		return &sloArrival{tier: tier, at: t0.Add(time.Duration(ms) * time.Millisecond), inWindow: true}
	}
	// One sequence, busy 1 s with batch from 0; interactive at 100 ms
	// starts at 1 s (wait 900 ms: met with a 50 ms path, not with 200 ms);
	// the second interactive at 150 ms waits for 2 s and misses.
	all := []*sloArrival{at(0, slo.Batch), at(10, slo.Batch), at(100, slo.Interactive), at(150, slo.Interactive)}
	if got := idealInteractive(all, 1, time.Second, 50*time.Millisecond, time.Second); got != 0.5 {
		t.Errorf("one sequence, 50 ms path: %v, want 0.5", got)
	}
	if got := idealInteractive(all, 1, time.Second, 200*time.Millisecond, time.Second); got != 0 {
		t.Errorf("one sequence, 200 ms path: %v, want 0", got)
	}
	// Two sequences, both taken by batch before the interactive requests
	// come: they start at 1 s and 1.01 s, within their TTFT.
	if got := idealInteractive(all, 2, time.Second, 50*time.Millisecond, time.Second); got != 1 {
		t.Errorf("two sequences: %v, want 1", got)
	}
}
