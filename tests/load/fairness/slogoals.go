package fairness

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
)

// The slo report's text: what ran, the tables, the goals and the
// published numbers beside them.

// The goals of the SLO benchmark, each on the median over the seeds.
const (
	sloGoalAttainment = 0.90 // interactive attainment at 2×
	sloAimAttainment  = 0.95
	sloGoalTTFTRatio  = 1.5  // FCFS's interactive TTFT p99 over Sluice's, at 2×
	sloGoalGoodput    = 0.95 // Sluice's total goodput over FCFS's, at 1×
	sloGoalBatch      = 0.9  // Sluice's batch goodput over FCFS's, at 2×
	sloOverload       = 2.0
	sloNominal        = 1.0
)

func (s *sloScenario) Report(r *report.Report) error {
	r.Header(s.what())
	r.Linef("answers: %s; each request asks max_tokens one more than its answer's length, so Sluice knows every answer's length and the answer ends as the model's own (finish_reason stop)%s", s.workload.source, s.directiveText())
	r.Linef("answer lengths: %s", s.lengthsText())
	r.Linef("capacity: %s; the simulator's timing gives %.2f answers/s (%d sequences × %.1f tokens at %v + %d × %v a decode step, prompt %d tokens at %v a token, time scale %g)",
		s.capacityText(), s.computedCapacity(), s.sim.MaxNumSeqs, s.workload.mean, s.sim.DecodeBase, s.sim.MaxNumSeqs, s.sim.DecodePerSeq,
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
	s.seedTable(r)
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
	return fmt.Sprintf("SLO attainment by tier under overload, where the client stands; workload %s. make run's configuration with one pool in use "+
		"(every prompt short) on a simulator of %d sequences, answers of %.0f tokens on average; two tiers, one tenant each, no rate limits: "+
		"%s (weight %d; SLO: TTFT <= %v and <= %v a token after the first; max_wait %v) and %s (weight %d; SLO: TTFT <= %v; max_wait %v), "+
		"%.0f%% of the arrivals %s; Poisson arrivals at %s× the capacity, each over %d seeds (seed k of step i: %d+100k+i, the same in every mode), "+
		"%v warm-up then a %v window a step, each window's arrivals followed to their end "+
		"(a client gives up %v after its arrival; the generator sends at most %d at once); modes: %s. Expected duration: about %.0f minutes",
		s.workload.name, s.seqs, s.workload.mean, in.Name, in.Weight, in.TTFT, in.TPOT, s.interactiveWait, b.Name, b.Weight, b.TTFT, b.MaxWait,
		100*s.interactive, in.Name, s.loads, s.seeds, s.seed, s.warmup, s.window, s.timeout, s.maxInFlight, s.modeNames(), s.expected().Minutes())
}

// expected is how long the run should take: per step its warm-up and
// window, the backlog an overload leaves to drain, a mean answer for the
// last ones to end, and a few seconds to go idle; the capacity's
// measurement and a stack's start each. The backlog is taken as half
// the excess over 1× of what arrived, as short runs of both workloads
// drained: interactive arrivals beyond their wait are refused, not
// queued.
func (s *sloScenario) expected() time.Duration {
	answer := s.meanAnswer
	if answer <= 0 { // not measured: the simulator's timing
		step := s.sim.DecodeBase + time.Duration(s.seqs)*s.sim.DecodePerSeq
		answer = time.Duration(s.workload.mean * float64(step) * s.sim.TimeScale)
	}
	sent := s.warmup + s.window
	var total time.Duration
	for _, mult := range s.loadList {
		step := sent + time.Duration(max(mult-1, 0)*float64(sent)/2) + answer + 3*time.Second
		total += step * time.Duration(s.seeds*len(s.modeList))
	}
	return total + 5*time.Second + s.capWindow + time.Duration(len(s.stackMode))*30*time.Second
}

func (s *sloScenario) directiveText() string {
	if !s.workload.directive {
		return ""
	}
	return "; its length travels as the simulator's answer-length directive in front of the query (Sluice passes the query on as the last user message; the simulator strips the directive before it counts the prompt, Sluice counts it as text). " +
		"Prompts are the fixed workload's (the bench's ten queries with Sluice's retrieval), not the trace's: its prompts of up to 1,021 tokens would send some requests to the long pool, " +
		"and it is an answer's length, not its prompt's, that holds a sequence"
}

// lengthsText says how many answers came as long as drawn, by mode, as
// the backend counted their completion tokens: the proof that each
// request asked the simulator for its length and got it. The token
// events the client read are counted beside.
func (s *sloScenario) lengthsText() string {
	var parts []string
	for _, m := range s.modeList {
		done, exact, events := 0, 0, 0
		var off []string
		var batch, paused, pauses, most int
		for _, st := range s.steps {
			if st.mode != m {
				continue
			}
			for _, a := range st.all {
				if a.res.Kind != chat.KindDone {
					continue
				}
				done++
				if a.tier == slo.Batch {
					batch++
					pauses += a.res.Pauses
					most = max(most, a.res.Pauses)
					if a.res.Pauses > 0 {
						paused++
					}
				}
				if a.res.Tokens == a.tokens {
					events++
				}
				if a.res.Completion == a.tokens {
					exact++
				} else if len(off) < 3 {
					off = append(off, fmt.Sprintf("%d for %d", a.res.Completion, a.tokens))
				}
			}
		}
		part := fmt.Sprintf("%s %d of %d answers exactly as long as drawn", modeName(m), exact, done)
		if len(off) > 0 {
			part += " (e.g. " + strings.Join(off, ", ") + ")"
		}
		part += fmt.Sprintf(", %d with as many token events", events)
		if m == modePreempt && batch > 0 {
			// Each pause is a continuation: the answers above came whole
			// across them.
			part += fmt.Sprintf("; pauses per batch (flex) answer %.2f (%d of %d answers paused, at most %d times)",
				float64(pauses)/float64(batch), paused, batch, most)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; ")
}

func (s *sloScenario) modeNames() string {
	names := make([]string, len(s.modeList))
	for i, m := range s.modeList {
		names[i] = modeName(m)
	}
	text := strings.Join(names, "; ")
	if !slices.Contains(s.modeList, modeHealing) {
		text += " (Sluice with healing on, -modes healing, is not run by default: the healer acts on a pool's latency tail, shrinking its batch, " +
			"throttling long requests or shedding the lowest tier's waiters, none of which frees a running sequence sooner, which is what an interactive arrival waits for at 2×)"
	}
	return text
}

func (s *sloScenario) capacityText() string {
	if !s.capMeasured {
		return fmt.Sprintf("%.2f answers/s, as given (-capacity)", s.measured)
	}
	return fmt.Sprintf("%.2f answers/s measured first: %d closed-loop clients straight to the simulator for %v (after 5s), every answer %d tokens (the workload's mean), over their mean answer time (%v)",
		s.measured, s.seqs, s.capWindow, s.workload.meanTokens(), s.meanAnswer.Round(time.Millisecond))
}

// modeRuns are a mode's and FCFS's steps at a load, seed by seed, where
// both ran.
func (s *sloScenario) modeRuns(mode string, mult float64) (sl, fc []*sloStep) {
	for _, st := range s.stepsOf(mode, mult) {
		if f := s.stepAt(modeFCFS, mult, st.run); f != nil {
			sl, fc = append(sl, st), append(fc, f)
		}
	}
	return sl, fc
}

// ratioGoal judges the median over the seeds of a ratio of a mode's
// measure to FCFS's at a load.
func (s *sloScenario) ratioGoal(r *report.Report, mode string, mult float64, what string, measure func(st *sloStep) (float64, bool), goal float64) {
	sl, fc := s.modeRuns(mode, mult)
	var ratios []float64
	for i := range sl {
		a, okA := measure(sl[i])
		b, okB := measure(fc[i])
		if okA && okB && b > 0 {
			ratios = append(ratios, a/b)
		}
	}
	want := fmt.Sprintf(">= %g×", goal)
	if len(ratios) == 0 {
		r.Goal(modeName(mode)+": "+what, fmt.Sprintf("not measured (needs both modes at %g×, FCFS's measure above 0)", mult), want, false)
		return
	}
	m := median(ratios)
	r.Goal(modeName(mode)+": "+what, fmt.Sprintf("median %.2f× over %d seeds (%s)", m, len(ratios), list(ratios, "%.2f")), want, m >= goal)
}

// goals judges one Sluice mode against the goals, each on the median
// over the seeds.
func (s *sloScenario) goals(r *report.Report, mode string) {
	name := modeName(mode)
	s.attainmentGoal(r, mode)
	s.ratioGoal(r, mode, sloOverload, "interactive TTFT p99 at 2×, FCFS's over Sluice's", func(st *sloStep) (float64, bool) {
		l := summarize(st.all, slo.Interactive).ttft
		if len(l) == 0 {
			return 0, false
		}
		return 1 / l.At(99).Seconds(), true
	}, sloGoalTTFTRatio)
	s.ratioGoal(r, mode, sloNominal, "total goodput at 1×, Sluice's over FCFS's", func(st *sloStep) (float64, bool) {
		return summarize(st.all, -1).goodput(st.window), true
	}, sloGoalGoodput)
	s.ratioGoal(r, mode, sloOverload, "batch goodput at 2×, Sluice's over FCFS's", func(st *sloStep) (float64, bool) {
		return summarize(st.all, slo.Batch).goodput(st.window), true
	}, sloGoalBatch)
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

// attainmentGoal judges the median over the seeds of a mode's
// interactive attainment at 2×, beside the ceiling without preemption
// on the same arrivals.
func (s *sloScenario) attainmentGoal(r *report.Report, mode string) {
	what := modeName(mode) + ": interactive attainment at 2× (median over the seeds)"
	want := fmt.Sprintf(">= %.0f%% (aim %.0f%%)", 100*sloGoalAttainment, 100*sloAimAttainment)
	steps := s.stepsOf(mode, sloOverload)
	if len(steps) == 0 {
		r.Goal(what, "no 2× step", want, false)
		return
	}
	path, pathText := s.ceilingPath()
	var got, ceil []float64
	for _, st := range steps {
		got = append(got, summarize(st.all, slo.Interactive).attainment())
		ceil = append(ceil, s.ceiling(st, path))
	}
	m := median(got)
	measured := fmt.Sprintf("%s over %d seeds (%s); the ceiling without preemption on the same arrivals (the best work-conserving scheduler that does not preempt, interactive first, each answer holding a sequence for its length at %v a token; %s): median %s (%s)",
		pct(m), len(got), list(got, "%"), (s.hold(1000) / 1000).Round(10*time.Microsecond), pathText, pct(median(ceil)), list(ceil, "%"))
	r.Goal(what, measured, want, m >= sloGoalAttainment)
}

// list writes values for the report: as percentages ("%"), or each with
// format.
func list(xs []float64, format string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		switch {
		case math.IsNaN(x):
			parts[i] = "—"
		case format == "%":
			parts[i] = pct(x)
		default:
			parts[i] = fmt.Sprintf(format, x)
		}
	}
	return strings.Join(parts, ", ")
}

// context puts the published numbers beside this run's at 2×: Sluice
// with preemption when it ran (the published schedulers preempt or
// migrate), else the first of Sluice's modes.
func (s *sloScenario) context(r *report.Report) {
	mode := modeSluice
	for _, m := range s.modeList {
		if m != modeFCFS {
			mode = m
			break
		}
	}
	if slices.Contains(s.modeList, modePreempt) {
		mode = modePreempt
	}
	r.Linef("Published numbers, for context only: theirs, on their hardware and workloads, not measured here.")
	r.Table("measure", fmt.Sprintf("this run, at 2× (%s vs FCFS to the simulator, medians over the seeds)", modeName(mode)), "published")
	gain, speed := "not measured", "not measured"
	if sl, fc := s.modeRuns(mode, sloOverload); len(sl) > 0 {
		att := func(steps []*sloStep, tier int) float64 {
			var xs []float64
			for _, st := range steps {
				xs = append(xs, summarize(st.all, tier).attainment())
			}
			return median(xs)
		}
		a, b := att(sl, slo.Interactive), att(fc, slo.Interactive)
		all, allF := att(sl, -1), att(fc, -1)
		gain = fmt.Sprintf("interactive %s vs %s (%+.1f points); all arrivals %s vs %s (%+.1f points)", pct(a), pct(b), 100*(a-b), pct(all), pct(allF), 100*(all-allF))
		var ratios []float64
		for i := range sl {
			x, y := summarize(sl[i].all, slo.Interactive).ttft, summarize(fc[i].all, slo.Interactive).ttft
			if len(x) > 0 && len(y) > 0 {
				ratios = append(ratios, float64(y.At(99))/float64(x.At(99)))
			}
		}
		if len(ratios) > 0 {
			speed = fmt.Sprintf("interactive TTFT p99: FCFS's %.2f× Sluice's", median(ratios))
		}
	}
	r.Row("SLO attainment over FCFS", gain, "QLM (SoCC '24): +40–90 % SLO attainment over FCFS vLLM; vLLM on A10/A100 GPUs, Mistral-7B to Llama-70B, ShareGPT-like traces")
	r.Row("high-priority requests faster", speed, "Llumnix (OSDI '24): high-priority requests up to 1.5× faster than vLLM-based serving; several instances with live migration")
}

func (s *sloScenario) notes(r *report.Report) {
	r.Linef("Attainment: the share of a window's arrivals answered within their tier's SLO; an arrival refused, timed out, cut or dropped by the generator missed it. "+
		"Goodput: those answers per second of the window. TTFT runs from the scheduled arrival to the first token (a late generator's lag included), TTFT percentiles "+
		"are of the arrivals that got one, pooled over the seeds in the first table; TPOT is (last token - first) / (tokens - 1) of each answer. Backlogged: a look at Sluice's admission queue (every pool) found "+
		"the tier's tenant waiting (the pools bench's definition; requests waiting at the door's waiting room are not in it); a tier's tokens while both were backlogged are "+
		"what its answers were served (prompt and output), each counted at its first token (its grant, seen from the client), within the %v before each look that found both waiting. "+
		"The ceiling is a model, replayed with the measured mean answer time and path cost: at 2× the interactive waits sit near the 1 s bound, where a few milliseconds move an arrival across, "+
		"so one seed's run can land a few points either side of it; read the medians.", s.sampleEvery)
	for _, st := range s.steps {
		if k := otherKinds(st.all); k != "" {
			r.Linef("%s %g× seed %d, missed: %s", modeName(st.mode), st.mult, st.seed, k)
		}
	}
}
