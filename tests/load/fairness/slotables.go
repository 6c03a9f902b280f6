package fairness

import (
	"fmt"

	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
)

// The slo report's tables: each load, mode and tier over the seeds; each
// seed's steps side by side with the ceiling; each tier's tokens while
// both were backlogged.

// stepTable is a row per load, mode and tier, and one for all tiers,
// over every seed: outcomes and latencies pooled, attainment and goodput
// the median of the seeds' (their range beside).
func (s *sloScenario) stepTable(r *report.Report) {
	r.Table("load", "mode", "tier", "offered", "arrivals", "dropped", "attainment (median, range)", "goodput (median)", "TTFT p50", "TTFT p99", "TPOT p50",
		outMet, outLate, outRefused, outTimedOut, outOther)
	for _, mult := range s.loadList {
		for _, m := range s.modeList {
			steps := s.stepsOf(m, mult)
			if len(steps) == 0 {
				continue
			}
			for _, tier := range []int{slo.Interactive, slo.Batch, -1} {
				s.stepRow(r, steps, tier)
			}
		}
	}
}

func (s *sloScenario) stepRow(r *report.Report, steps []*sloStep, tier int) {
	var all []*sloArrival
	var att, good []float64
	for _, st := range steps {
		all = append(all, st.all...)
		sum := summarize(st.all, tier)
		att, good = append(att, sum.attainment()), append(good, sum.goodput(st.window))
	}
	sum := summarize(all, tier)
	name := "all"
	if tier >= 0 {
		name = slo.Tiers[tier].Name
	}
	o := sum.outcomes
	lo, hi := att[0], att[0]
	for _, a := range att {
		lo, hi = min(lo, a), max(hi, a)
	}
	window := steps[0].window.Seconds() * float64(len(steps))
	r.Row(fmt.Sprintf("%g×", steps[0].mult), modeName(steps[0].mode), name, fmt.Sprintf("%.2f/s", float64(sum.arrivals)/window),
		fmt.Sprint(sum.arrivals), fmt.Sprint(o[outDropped]), fmt.Sprintf("%s (%s–%s)", pct(median(att)), pct(lo), pct(hi)), fmt.Sprintf("%.2f/s", median(good)),
		sloDur(sum.ttft, 50), sloDur(sum.ttft, 99), sloDur(sum.tpot, 50),
		fmt.Sprint(o[outMet]), fmt.Sprint(o[outLate]), fmt.Sprint(o[outRefused]), fmt.Sprint(o[outTimedOut]), fmt.Sprint(o[outOther]))
}

// seedTable is a row per load and seed: its arrivals, the mean answer
// drawn for them, each mode's interactive and batch attainment and total
// goodput, and the ceiling without preemption on its arrivals.
func (s *sloScenario) seedTable(r *report.Report) {
	cols := []string{"load", "seed", "arrivals (interactive / batch)", "mean answer"}
	ceilMode := ""
	for _, m := range s.modeList {
		cols = append(cols, modeName(m)+": interactive / batch / goodput")
		if ceilMode == "" && m != modeFCFS {
			ceilMode = m
		}
	}
	if ceilMode == "" {
		ceilMode = modeFCFS
	}
	path, pathText := s.ceilingPath()
	r.Linef("Each seed (the ceiling: the best work-conserving scheduler that does not preempt, on the seed's arrivals and lengths, with %s):", pathText)
	r.Table(append(cols, "ceiling (interactive)")...)
	for _, mult := range s.loadList {
		for k := range s.seeds {
			var first *sloStep
			cells := []string{}
			for _, m := range s.modeList {
				st := s.stepAt(m, mult, k)
				if st == nil {
					cells = append(cells, "—")
					continue
				}
				if first == nil || m == ceilMode {
					first = st
				}
				in, b, all := summarize(st.all, slo.Interactive), summarize(st.all, slo.Batch), summarize(st.all, -1)
				cells = append(cells, fmt.Sprintf("%s / %s / %.2f/s", pct(in.attainment()), pct(b.attainment()), all.goodput(st.window)))
			}
			if first == nil {
				continue
			}
			in, b := summarize(first.all, slo.Interactive), summarize(first.all, slo.Batch)
			row := append([]string{fmt.Sprintf("%g×", mult), fmt.Sprint(first.seed), fmt.Sprintf("%d / %d", in.arrivals, b.arrivals),
				fmt.Sprintf("%.0f", meanDrawn(first.all))}, cells...)
			r.Row(append(row, pct(s.ceiling(first, path)))...)
		}
	}
}

// shareTable is each Sluice mode's tokens at each load while both tiers
// were backlogged, over every seed.
func (s *sloScenario) shareTable(r *report.Report) {
	r.Table("load", "mode", "queue looks", "both backlogged", "interactive tokens granted", "batch tokens granted", "batch share")
	for _, mult := range s.loadList {
		for _, m := range s.modeList {
			if m == modeFCFS {
				continue
			}
			steps := s.stepsOf(m, mult)
			if len(steps) == 0 {
				continue
			}
			var tok [len(slo.Tiers)]float64
			both, looks := 0, 0
			for _, st := range steps {
				t, n := backloggedTokens(st.all, st.samples, s.sampleEvery)
				for i := range tok {
					tok[i] += t[i]
				}
				both, looks = both+n, looks+len(st.samples)
			}
			share := "—"
			if sum := tok[slo.Interactive] + tok[slo.Batch]; sum > 0 {
				share = pct(tok[slo.Batch] / sum)
			}
			r.Row(fmt.Sprintf("%g×", mult), modeName(m), fmt.Sprint(looks), fmt.Sprint(both),
				fmt.Sprintf("%.0f", tok[slo.Interactive]), fmt.Sprintf("%.0f", tok[slo.Batch]), share)
		}
	}
}
