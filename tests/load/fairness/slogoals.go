package fairness

import (
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
)

// The slo report's text: what ran, the tables, the goals and the
// published numbers beside them.

// The goals of issue 25's SLO benchmark, at these loads.
const (
	sloGoalAttainment = 0.90 // interactive attainment at 2×
	sloGoalTTFTRatio  = 1.5  // FCFS's interactive TTFT p99 over Sluice's, at 2×
	sloGoalGoodput    = 0.9  // Sluice's total goodput over FCFS's, at 1×
	sloOverload       = 2.0
	sloNominal        = 1.0
)

func (s *sloScenario) Report(r *report.Report) error {
	r.Header(s.what())
	r.Linef("capacity: %s; the simulator's timing gives %.2f answers/s (%d sequences × %d tokens at %v + %d × %v a decode step, prompt %d tokens at %v a token, time scale %g)",
		s.capacityText(), s.computedCapacity(), s.sim.MaxNumSeqs, s.maxTokens, s.sim.DecodeBase, s.sim.MaxNumSeqs, s.sim.DecodePerSeq,
		s.promptTokens.Load(), s.sim.PrefillPerToken, s.sim.TimeScale)
	r.Linef("routing: the longest prompt was %d tokens, under routing.short_threshold_tokens (%d): every request is the short pool's; both pools name the one simulator, so they share one budget of %d permits (pools.shared)",
		s.promptTokens.Load(), s.cfg.Routing.ShortThresholdTokens, s.cfg.Pools.SharedLimit())
	r.Linef("mix: at 2× the interactive tier alone offers %.2f× the capacity against its weighted share of %.2f× (%d/%d); at 50/50 it would offer 1×, more than the model serves, which no scheduler could answer within a 1s TTFT",
		2*s.interactive, weightedShare(slo.Interactive), slo.Tiers[slo.Interactive].Weight, slo.Tiers[slo.Interactive].Weight+slo.Tiers[slo.Batch].Weight)
	r.Linef("max_wait: each tier's is its TTFT bound (interactive %v, batch %v): a request still waiting then has missed its SLO whatever comes next, and refusing it frees its client at once",
		s.interactiveWait, slo.Tiers[slo.Batch].MaxWait)
	r.Linef("")
	s.stepTable(r)
	r.Linef("")
	s.shareTable(r)
	r.Linef("")
	for _, m := range s.modeList {
		if m != modeFCFS {
			s.goals(r, m)
		}
	}
	r.Linef("")
	s.context(r)
	r.Linef("")
	s.notes(r)
	return nil
}

func (s *sloScenario) what() string {
	in, b := slo.Tiers[slo.Interactive], slo.Tiers[slo.Batch]
	return fmt.Sprintf("SLO attainment by tier under overload, where the client stands. make run's configuration with one pool in use "+
		"(every prompt short) on a simulator of %d sequences, every answer %d tokens; two tiers, one tenant each, no rate limits: "+
		"%s (weight %d; SLO: TTFT <= %v and <= %v a token after the first; max_wait %v) and %s (weight %d; SLO: TTFT <= %v; max_wait %v), "+
		"%.0f%% of the arrivals %s; Poisson arrivals at %s× the capacity, %v warm-up then a %v window a step, each window's arrivals followed to their end "+
		"(a client gives up %v after its arrival; the generator sends at most %d at once); modes, same arrivals (seed %d+step): %s",
		s.seqs, s.maxTokens, in.Name, in.Weight, in.TTFT, in.TPOT, s.interactiveWait, b.Name, b.Weight, b.TTFT, b.MaxWait,
		100*s.interactive, in.Name, s.loads, s.warmup, s.window, s.timeout, s.maxInFlight, s.seed, s.modeNames())
}

func (s *sloScenario) modeNames() string {
	names := make([]string, len(s.modeList))
	for i, m := range s.modeList {
		names[i] = modeName(m)
	}
	return strings.Join(names, "; ") + " (healing as make run configures it)"
}

func (s *sloScenario) capacityText() string {
	if !s.capMeasured {
		return fmt.Sprintf("%.2f answers/s, as given (-capacity)", s.measured)
	}
	return fmt.Sprintf("%.2f answers/s measured first: %d closed-loop clients straight to the simulator for %v (after 5s), over their mean answer time", s.measured, s.seqs, s.capWindow)
}

// stepTable is a row per load, mode and tier, and one for all tiers.
func (s *sloScenario) stepTable(r *report.Report) {
	r.Table("load", "mode", "tier", "offered", "arrivals", "dropped", "attainment", "goodput", "TTFT p50", "TTFT p99", "TPOT p50",
		outMet, outLate, outRefused, outTimedOut, outOther)
	for _, mult := range s.loadList {
		for _, m := range s.modeList {
			st := s.find(m, mult)
			if st == nil {
				continue
			}
			for _, tier := range []int{slo.Interactive, slo.Batch, -1} {
				s.stepRow(r, st, tier)
			}
		}
	}
}

func (s *sloScenario) stepRow(r *report.Report, st *sloStep, tier int) {
	sum := summarize(st.all, tier)
	name := "all"
	if tier >= 0 {
		name = slo.Tiers[tier].Name
	}
	o := sum.outcomes
	r.Row(fmt.Sprintf("%g×", st.mult), modeName(st.mode), name, fmt.Sprintf("%.2f/s", float64(sum.arrivals)/st.window.Seconds()),
		fmt.Sprint(sum.arrivals), fmt.Sprint(o[outDropped]), pct(sum.attainment()), fmt.Sprintf("%.2f/s", sum.goodput(st.window)),
		sloDur(sum.ttft, 50), sloDur(sum.ttft, 99), sloDur(sum.tpot, 50),
		fmt.Sprint(o[outMet]), fmt.Sprint(o[outLate]), fmt.Sprint(o[outRefused]), fmt.Sprint(o[outTimedOut]), fmt.Sprint(o[outOther]))
}

// shareTable is each Sluice step's tokens while both tiers were
// backlogged.
func (s *sloScenario) shareTable(r *report.Report) {
	r.Table("load", "mode", "queue looks", "both backlogged", "interactive tokens granted", "batch tokens granted", "batch share")
	for _, mult := range s.loadList {
		for _, m := range s.modeList {
			st := s.find(m, mult)
			if st == nil || m == modeFCFS {
				continue
			}
			tok, both := backloggedTokens(st.all, st.samples, s.sampleEvery)
			share := "—"
			if sum := tok[slo.Interactive] + tok[slo.Batch]; sum > 0 {
				share = pct(tok[slo.Batch] / sum)
			}
			r.Row(fmt.Sprintf("%g×", mult), modeName(m), fmt.Sprint(len(st.samples)), fmt.Sprint(both),
				fmt.Sprintf("%.0f", tok[slo.Interactive]), fmt.Sprintf("%.0f", tok[slo.Batch]), share)
		}
	}
}

// goals judges one Sluice mode against the four goals.
func (s *sloScenario) goals(r *report.Report, mode string) {
	name := modeName(mode)
	over, overFCFS := s.find(mode, sloOverload), s.find(modeFCFS, sloOverload)
	if over == nil {
		r.Goal(name+": interactive attainment at 2×", "no 2× step", fmt.Sprintf(">= %.0f%%", 100*sloGoalAttainment), false)
	} else {
		a := summarize(over.all, slo.Interactive).attainment()
		measured := pct(a)
		if c := s.idealText(over); c != "" {
			measured += "; " + c
		}
		r.Goal(name+": interactive attainment at 2×", measured, fmt.Sprintf(">= %.0f%%", 100*sloGoalAttainment), a >= sloGoalAttainment)
	}
	measured, met := ttftRatio(over, overFCFS)
	r.Goal(name+": interactive TTFT p99 at 2×, FCFS's over Sluice's", measured, fmt.Sprintf(">= %.1f×", sloGoalTTFTRatio), met)
	measured, met = goodputRatio(s.find(mode, sloNominal), s.find(modeFCFS, sloNominal))
	r.Goal(name+": total goodput at 1×, Sluice's over FCFS's", measured, fmt.Sprintf(">= %.1f×", sloGoalGoodput), met)
	var tok [len(slo.Tiers)]float64
	both := 0
	for _, st := range s.steps {
		if st.mode == mode {
			t, n := backloggedTokens(st.all, st.samples, s.sampleEvery)
			tok[slo.Interactive], tok[slo.Batch], both = tok[slo.Interactive]+t[slo.Interactive], tok[slo.Batch]+t[slo.Batch], both+n
		}
	}
	want := weightedShare(slo.Batch)
	if sum := tok[slo.Interactive] + tok[slo.Batch]; sum > 0 {
		share := tok[slo.Batch] / sum
		r.Goal(name+": batch tier's share of the tokens while both tiers were backlogged (every step)", fmt.Sprintf("%s over %d looks", pct(share), both),
			">= "+pct(want)+" (its weight's share)", share >= want)
	} else {
		r.Goal(name+": batch tier's share of the tokens while both tiers were backlogged (every step)", "never both backlogged", ">= "+pct(want), false)
	}
}

// ttftRatio is FCFS's interactive TTFT p99 over Sluice's at a load.
func ttftRatio(sluice, fcfs *sloStep) (string, bool) {
	if sluice == nil || fcfs == nil {
		return "not measured (needs both modes at 2×)", false
	}
	sa, sb := summarize(sluice.all, slo.Interactive), summarize(fcfs.all, slo.Interactive)
	a, b := sa.ttft, sb.ttft
	if len(a) == 0 || len(b) == 0 {
		return "not measured (no interactive first token)", false
	}
	ratio := float64(b.At(99)) / float64(a.At(99))
	return fmt.Sprintf("%.2f× (FCFS %s over the %d of %d arrivals with a first token, Sluice %s over %d of %d)",
		ratio, sloDur(b, 99), len(b), sb.arrivals, sloDur(a, 99), len(a), sa.arrivals), ratio >= sloGoalTTFTRatio
}

// goodputRatio is Sluice's total goodput over FCFS's at a load.
func goodputRatio(sluice, fcfs *sloStep) (string, bool) {
	if sluice == nil || fcfs == nil {
		return "not measured (needs both modes at 1×)", false
	}
	a, b := summarize(sluice.all, -1).goodput(sluice.window), summarize(fcfs.all, -1).goodput(fcfs.window)
	if b == 0 {
		return fmt.Sprintf("FCFS met no SLO (Sluice %.2f/s)", a), a > 0
	}
	return fmt.Sprintf("%.2f× (Sluice %.2f/s, FCFS %.2f/s)", a/b, a, b), a/b >= sloGoalGoodput
}

// context puts the published numbers beside this run's at 2×.
func (s *sloScenario) context(r *report.Report) {
	r.Linef("Published numbers, for context only: theirs, on their hardware and workloads, not measured here.")
	r.Table("measure", "this run, at 2× (Sluice healing off vs FCFS to the simulator)", "published")
	off, fcfs := s.find(modeHealOff, sloOverload), s.find(modeFCFS, sloOverload)
	gain, speed := "not measured", "not measured"
	if off != nil && fcfs != nil {
		a, b := summarize(off.all, slo.Interactive).attainment(), summarize(fcfs.all, slo.Interactive).attainment()
		all, allF := summarize(off.all, -1).attainment(), summarize(fcfs.all, -1).attainment()
		gain = fmt.Sprintf("interactive %s vs %s (%+.1f points); all arrivals %s vs %s (%+.1f points)", pct(a), pct(b), 100*(a-b), pct(all), pct(allF), 100*(all-allF))
		speed, _ = ttftRatio(off, fcfs)
		speed = "interactive TTFT p99: " + speed
	}
	r.Row("SLO attainment over FCFS", gain, "QLM (SoCC '24): +40–90 % SLO attainment over FCFS vLLM; vLLM on A10/A100 GPUs, Mistral-7B to Llama-70B, ShareGPT-like traces")
	r.Row("high-priority requests faster", speed, "Llumnix (OSDI '24): high-priority requests up to 1.5× faster than vLLM-based serving; several instances with live migration")
}

func (s *sloScenario) notes(r *report.Report) {
	r.Linef("Attainment: the share of a window's arrivals answered within their tier's SLO; an arrival refused, timed out, cut or dropped by the generator missed it. "+
		"Goodput: those answers per second of the window. TTFT runs from the scheduled arrival to the first token (a late generator's lag included), TTFT percentiles "+
		"are of the arrivals that got one; TPOT is (last token - first) / (tokens - 1) of each answer. Backlogged: a look at Sluice's admission queue (every pool) found "+
		"the tier's tenant waiting (the pools bench's definition; requests waiting at the door's waiting room are not in it); a tier's tokens while both were backlogged are "+
		"what its answers were served (prompt and output), each counted at its first token (its grant, seen from the client), within the %v before each look that found both waiting.", s.sampleEvery)
	for _, st := range s.steps {
		if k := otherKinds(st.all); k != "" {
			r.Linef("%s %g×, not answered: %s", modeName(st.mode), st.mult, k)
		}
	}
}
