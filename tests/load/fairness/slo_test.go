package fairness

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"

	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
	"github.com/sluice-dev/sluice/tests/load/vtc"
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
	// Two seeds a load; the goals take the median of the seeds' ratios
	// (of two, their mean).
	step := func(mode string, mult float64, run int, ttft time.Duration, n, batch int) *sloStep {
		s := &sloStep{mode: mode, mult: mult, run: run, window: 10 * time.Second, samples: samples}
		for range n {
			s.all = append(s.all, ans(slo.Interactive, t0, ttft, 100))
		}
		for range batch {
			s.all = append(s.all, ans(slo.Batch, t0, 2*time.Second, 100))
		}
		return s
	}
	s := &sloScenario{modeList: []string{modeSluice, modeFCFS}, loadList: []float64{1, 2}, seqs: 1, meanAnswer: time.Second,
		workload: sloWorkload{mean: 10}, sampleEvery: 500 * time.Millisecond, steps: []*sloStep{
			step(modeSluice, 2, 0, 100*time.Millisecond, 10, 9), step(modeFCFS, 2, 0, 3*time.Second, 10, 10),
			step(modeSluice, 2, 1, 200*time.Millisecond, 10, 10), step(modeFCFS, 2, 1, 2*time.Second, 10, 10),
			step(modeSluice, 1, 0, 100*time.Millisecond, 8, 0), step(modeFCFS, 1, 0, 100*time.Millisecond, 10, 0),
			step(modeSluice, 1, 1, 100*time.Millisecond, 10, 0), step(modeFCFS, 1, 1, 100*time.Millisecond, 10, 0),
		}}
	r := &report.Report{Name: "slo"}
	s.goals(r, modeSluice)
	text := strings.Join(r.Lines, "\n")
	for _, want := range []string{
		"interactive attainment at 2× (median over the seeds): 100.0% over 2 seeds (100.0%, 100.0%)",
		"(goal >= 90% (aim 95%)) — met",
		"FCFS's over Sluice's: median 20.00× over 2 seeds (30.00, 10.00) (goal >= 1.5×) — met",
		"total goodput at 1×, Sluice's over FCFS's: median 0.90× over 2 seeds (0.80, 1.00) (goal >= 0.95×) — MISSED",
		"batch goodput at 2×, Sluice's over FCFS's: median 0.95× over 2 seeds (0.90, 1.00) (goal >= 0.9×) — met",
		"the tokens while both tiers were backlogged (every step): 0.0% over 4 looks",
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
		return &sloArrival{tier: tier, tokens: 128, at: t0.Add(time.Duration(ms) * time.Millisecond), inWindow: true}
	}
	second := func(int) time.Duration { return time.Second }
	// One sequence, busy 1 s with batch from 0; interactive at 100 ms
	// starts at 1 s (wait 900 ms: met with a 50 ms path, not with 200 ms);
	// the second interactive at 150 ms waits for 2 s and misses.
	all := []*sloArrival{at(0, slo.Batch), at(10, slo.Batch), at(100, slo.Interactive), at(150, slo.Interactive)}
	if got := idealInteractive(all, 1, second, 50*time.Millisecond, time.Second); got != 0.5 {
		t.Errorf("one sequence, 50 ms path: %v, want 0.5", got)
	}
	if got := idealInteractive(all, 1, second, 200*time.Millisecond, time.Second); got != 0 {
		t.Errorf("one sequence, 200 ms path: %v, want 0", got)
	}
	// Two sequences, both taken by batch before the interactive requests
	// come: they start at 1 s and 1.01 s, within their TTFT.
	if got := idealInteractive(all, 2, second, 50*time.Millisecond, time.Second); got != 1 {
		t.Errorf("two sequences: %v, want 1", got)
	}
}

// With lengths that vary, each answer holds its sequence for its own
// length: when sequences free depends on which answers hold them.
func TestIdealInteractiveVariableLengths(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms, tier, tokens int) *sloArrival {
		return &sloArrival{tier: tier, tokens: tokens, at: t0.Add(time.Duration(ms) * time.Millisecond), inWindow: true}
	}
	ms := func(tokens int) time.Duration { return time.Duration(tokens) * time.Millisecond } // 1 ms a token
	cases := []struct {
		name string
		seqs int
		all  []*sloArrival
		want float64
	}{
		// Batch holds the one sequence 0–500 ms; the first interactive
		// (100 ms) starts at 500 (wait 400) and holds it to 700; the
		// second (150 ms) starts at 700 (wait 550): both met.
		{"short batch", 1, []*sloArrival{at(0, slo.Batch, 500), at(100, slo.Interactive, 200), at(150, slo.Interactive, 100)}, 1},
		// Batch holds it to 1000: the first starts at 1000 (wait 900, met)
		// and holds it to 1200; the second would wait 1050: gives up.
		{"long batch", 1, []*sloArrival{at(0, slo.Batch, 1000), at(100, slo.Interactive, 200), at(150, slo.Interactive, 100)}, 0.5},
		// Two sequences: batch of 300 and of 2000 tokens. The short one
		// frees at 300: interactive at 50 starts there (wait 250), frees
		// it at 310; interactive at 60 starts at 310 (wait 250).
		{"two sequences, one frees soon", 2, []*sloArrival{at(0, slo.Batch, 300), at(1, slo.Batch, 2000), at(50, slo.Interactive, 10), at(60, slo.Interactive, 10)}, 1},
		// The same arrivals, every answer of their mean length (1155):
		// the first sequence frees at 1155, the first interactive waits
		// 1105 and gives up, so does the second.
		{"the same, every answer the mean", 2, []*sloArrival{at(0, slo.Batch, 1155), at(1, slo.Batch, 1155), at(50, slo.Interactive, 1155), at(60, slo.Interactive, 1155)}, 0},
	}
	for _, c := range cases {
		if got := idealInteractive(c.all, c.seqs, ms, 0, time.Second); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// The scenario's hold: the measured mean answer time, in proportion
	// to the answer's length against the mean's.
	s := &sloScenario{meanAnswer: 3 * time.Second, workload: sloWorkload{mean: 128}}
	if got := s.hold(64); got != 1500*time.Millisecond {
		t.Errorf("hold of 64 tokens at 3 s for 128: %v, want 1.5s", got)
	}
}

// The vtc workload's lengths are the output column of the trace in -dir,
// drawn uniformly and the same for the same seed; fixed is one length.
func TestSLOWorkloadLengths(t *testing.T) {
	dir := t.TempDir()
	csv := "arrival_s,client,prompt_tokens,output_tokens\n0.5,c1,10,30\n0.0,c0,20,10\n1.0,c0,5,20\n"
	if err := os.WriteFile(filepath.Join(dir, "vtc-real.csv"), []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := newSLOWorkload(workloadVTC, 128, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.lengths, []int{10, 30, 20}) || w.mean != 20 || w.meanTokens() != 20 || !w.directive {
		t.Fatalf("vtc workload: lengths %v, mean %v, directive %v; want [10 30 20] (by arrival), 20, true", w.lengths, w.mean, w.directive)
	}
	seen := map[int]int{}
	a, b := lengthRNG(7), lengthRNG(7)
	for range 300 {
		x := w.draw(a)
		if y := w.draw(b); x != y {
			t.Fatalf("the same seed drew %d and %d", x, y)
		}
		seen[x]++
	}
	for _, l := range w.lengths {
		if seen[l] < 60 { // 100 expected of each
			t.Errorf("drew %d %d times of 300: %v", l, seen[l], seen)
		}
	}
	if len(seen) != 3 {
		t.Errorf("drew %v: only the column's lengths", seen)
	}
	if q := w.query("Why?", 30); q != llmsim.AnswerTokensDirective(30)+"Why?" {
		t.Errorf("query %q: want the directive in front", q)
	}
	msgs := []openai.Message{openai.TextMessage("system", "ctx"), openai.TextMessage("user", "Why?")}
	got := w.messages(msgs, 30)
	if text, n := llmsim.StripAnswerTokens(mustText(t, got[1])); n != 30 || text != "Why?" || mustText(t, msgs[1]) != "Why?" || mustText(t, got[0]) != "ctx" {
		t.Errorf("messages: %q asks %d; want the query after a directive of 30, msgs unchanged", text, n)
	}

	fixed, err := newSLOWorkload(workloadFixed, 128, dir)
	if err != nil {
		t.Fatal(err)
	}
	if fixed.draw(a) != 128 || fixed.meanTokens() != 128 || fixed.directive || fixed.query("Why?", 128) != "Why?" {
		t.Errorf("fixed: %+v", fixed)
	}
	if _, err := newSLOWorkload(workloadVTC, 128, t.TempDir()); err == nil || !strings.Contains(err.Error(), "-dir") {
		t.Errorf("no trace: %v, want an error naming -dir", err)
	}
	if _, err := newSLOWorkload("spread", 128, dir); err == nil || !strings.Contains(err.Error(), "-workload") {
		t.Errorf("unknown workload: %v, want an error naming -workload", err)
	}
}

// The shared trace, when present, is its 1,500 recorded answers.
func TestSLOWorkloadSharedTrace(t *testing.T) {
	dir := filepath.Join("..", "..", "..", vtc.DefaultDir)
	if _, err := os.Stat(vtc.Workloads["real"].Path(dir)); err != nil {
		t.Skipf("no shared workloads: %v", err)
	}
	w, err := newSLOWorkload(workloadVTC, 128, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.lengths) != 1500 || w.meanTokens() != 256 {
		t.Errorf("%d lengths, mean %v; want 1500, 256.2", len(w.lengths), w.mean)
	}
}

func mustText(t *testing.T, m openai.Message) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(m.Content, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{0.9, 0.6, 0.7, 0.8, 1}, 0.8}} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing: want NaN")
	}
	xs := []float64{3, 1, 2}
	median(xs)
	if !slices.Equal(xs, []float64{3, 1, 2}) {
		t.Errorf("median sorted its argument: %v", xs)
	}
}

// Each Sluice mode gets a stack of its own, FCFS runs on the first (or
// on one of its own when it runs alone); a mode not in the list is
// refused by name.
func TestSLOModes(t *testing.T) {
	for _, c := range []struct {
		modes       string
		list, stack []string
	}{
		{"sluice,fcfs", []string{modeSluice, modeFCFS}, []string{modeSluice}},
		{"sluice, healing ,fcfs", []string{modeSluice, modeHealing, modeFCFS}, []string{modeSluice, modeHealing}},
		{"fcfs", []string{modeFCFS}, []string{modeFCFS}},
		{"sluice,preempt,fcfs", []string{modeSluice, modePreempt, modeFCFS}, []string{modeSluice, modePreempt}},
	} {
		s := &sloScenario{modes: c.modes}
		if err := s.parseModes(); err != nil {
			t.Fatalf("%q: %v", c.modes, err)
		}
		if !slices.Equal(s.modeList, c.list) || !slices.Equal(s.stackMode, c.stack) {
			t.Errorf("%q: modes %v on stacks %v; want %v on %v", c.modes, s.modeList, s.stackMode, c.list, c.stack)
		}
	}
	s := &sloScenario{modes: "sluice,off"}
	if err := s.parseModes(); err == nil || err.Error() != `-modes: "off" is none of sluice, healing, preempt, fcfs` {
		t.Errorf("unknown mode: %v", err)
	}
}

// The preempt mode runs Sluice with preemption on: the pools continue
// answers, the interactive tier is served in the priority class and the
// batch tier in flex, at the weights the sluice mode gives them, and the
// configuration is one Sluice starts with.
func TestSLOPreemptMode(t *testing.T) {
	s := &sloScenario{seqs: 16, interactiveWait: slo.Tiers[slo.Interactive].MaxWait}
	cfg := config.Default()
	s.configure(&cfg)
	plain := cfg.Limits.Tiers[slo.Tiers[slo.Interactive].Name].Weight
	modeOf(modePreempt).configure(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !cfg.Admission.Preemption.Enabled || cfg.Pools.Short.Continuation != config.ContinuationVLLM || cfg.Pools.Long.Continuation != config.ContinuationVLLM {
		t.Fatalf("preemption %+v, continuation %q/%q", cfg.Admission.Preemption, cfg.Pools.Short.Continuation, cfg.Pools.Long.Continuation)
	}
	for i, want := range []string{request.ClassPriority, request.ClassFlex} {
		tier := cfg.Limits.Tiers[slo.Tiers[i].Name]
		if c, ok := tier.Classes[want]; tier.DefaultClass != want || !ok || len(tier.Classes) != 1 || c.Weight != tier.Weight {
			t.Errorf("tier %s: default class %q, classes %+v; want %s alone at weight %d", slo.Tiers[i].Name, tier.DefaultClass, tier.Classes, want, tier.Weight)
		}
	}
	if got := cfg.Limits.Tiers[slo.Tiers[slo.Interactive].Name].Weight; got != plain {
		t.Errorf("interactive weight %d, want the sluice mode's %d", got, plain)
	}
}
