package vtc

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/request"
)

// The report's sections: per workload, the simulator's sizing, this
// run's systems beside the paper's numbers, what became of the
// requests; then the goals of issue 25. Each stack's report writes them
// on a Sheet of its own.

// Sheet is where the sections are written: lines of text, a markdown
// table's columns and rows, and goal lines.
type Sheet interface {
	Linef(format string, args ...any)
	Table(columns ...string)
	Row(cells ...string)
	Goal(what, measured, want string, met bool)
}

// Goals: Sluice beside the paper's VTC row that knew what Sluice knew
// of the answers' lengths (known when max_tokens is the recorded length,
// unknown otherwise): on overload its accumulated difference at the last
// reading no worse than that row's; on real, Max Diff and Avg Diff at
// most that row's share of the paper's FCFS; on both, throughput within
// 5% of FCFS's in the same run (a fair order that starves the backend is
// no win). A run that did not know the lengths aims at the known-length
// row.
const tputShare = 0.95

// WriteRun writes one workload's sizing, table and outcomes; cfg is
// Sluice's configuration it ran on.
func WriteRun(sh Sheet, run *Run, o Options, cfg config.Config) {
	z := run.Sizing
	sh.Linef("")
	sh.Linef("## %s: %d requests from %d clients over %.0f s (of %.0f s recorded)", run.Workload.Name, len(run.Rows), len(run.Keys), o.Duration, z.Seconds)
	sh.Linef("offered %.0f tok/s (prompt + output) = %.2f× the simulator's capacity of %.0f tok/s, the paper's FCFS throughput; simulator: %d sequences at once; "+
		"decode step %v + %v per sequence, prefill %v per token (llmsim's defaults × %.3f, so that a full batch serves the workload at that capacity), KV cache 4096 blocks, time scale 1/%g; "+
		"Sluice: the pools share the simulator's %d sequences (one fair queue across them; short may hold %d, long %d), api.queue_per_permit %g (a pool's admission queue holds fewer than that many requests per permit; the rest wait in the door's waiting room)",
		z.Offered, z.Load, z.Capacity, z.Batch, z.DecodeBase.Round(1e3), z.DecodePerSeq.Round(1e3), z.Prefill.Round(1e2), z.Factor, o.Speed,
		cfg.Pools.SharedLimit(), cfg.Pools.Short.MaxConcurrency, cfg.Pools.Long.MaxConcurrency, cfg.API.QueuePerPermit)
	if o.OnePool {
		sh.Linef("-one-pool: every request routed to the short pool (routing.short_threshold_tokens and pools.short.max_prompt_tokens %d), "+
			"whose %d permits fill the simulator's batch: one fair queue for the backend", cfg.Routing.ShortThresholdTokens, cfg.Pools.Short.MaxConcurrency)
	}
	sh.Linef("")
	writeTable(sh, run)
	sh.Linef("")
	for _, fs := range run.Systems {
		sh.Linef("%s: accumulated difference at %s s: %s", fs.Label, joinFloats(run.Spec.Ticks(), "%.0f", run.Spec.Warmup), joinFloats(fs.Result.AccDiff, "%.0f", 0))
		sh.Linef("%s: windowed difference at the same readings: %s", fs.Label, joinFloats(fs.Result.WinDiff, "%.0f", 0))
		sh.Linef("%s: %s; replay took %s of wall time", fs.Label, fs.OutcomeCounts(), fs.Took.Round(1e8))
		if fs.Name == Sluice {
			writePools(sh, run, fs, cfg.Routing.ShortThresholdTokens)
		}
	}
	writePrompts(sh, run)
}

// writeTable is the paper's table: this run's systems, then the paper's
// schedulers.
func writeTable(sh Sheet, run *Run) {
	sh.Table("scheduler", "accumulated difference at the last reading", "Max Diff", "Avg Diff", "throughput (tok/s)", "throughput / FCFS (same run)")
	fcfs := run.System(FCFS)
	for _, fs := range run.Systems {
		res := fs.Result
		ratio := "—"
		if fcfs != nil && fcfs.Result.Throughput > 0 {
			ratio = fmt.Sprintf("%.3f", res.Throughput/fcfs.Result.Throughput)
		}
		sh.Row(fs.Label, fmt.Sprintf("%.0f", lastOf(res.AccDiff)), fmt.Sprintf("%.1f", res.MaxDiff), fmt.Sprintf("%.1f", res.AvgDiff),
			fmt.Sprintf("%.0f", res.Throughput), ratio)
	}
	for _, p := range run.Workload.Paper {
		acc := "—"
		if p.AccDiff >= 0 {
			acc = fmt.Sprintf("%.0f", p.AccDiff)
		}
		sh.Row("paper: "+p.Scheduler, acc, fmt.Sprintf("%.1f", p.MaxDiff), fmt.Sprintf("%.1f", p.AvgDiff),
			fmt.Sprintf("%.0f (its GPU)", p.Throughput), fmt.Sprintf("%.3f", p.Throughput/run.Workload.Paper[0].Throughput))
	}
}

// writePools says how the requests were routed and what the pools held
// afterwards.
func writePools(sh Sheet, run *Run, fs *System, threshold int) {
	planned := map[string]int{}
	for _, n := range run.SluicePrompt {
		planned[request.Route(n, 0, threshold)]++
	}
	answered := map[string]int{}
	for _, o := range fs.Outcomes {
		if o.Route != "" {
			answered[o.Route]++
		}
	}
	var parts []string
	for _, p := range []string{request.PoolShort, request.PoolLong} {
		parts = append(parts, fmt.Sprintf("%s %d sent, %d answered", p, planned[p], answered[p]))
	}
	sh.Linef("Sluice's pools (prompts over %d tokens as Sluice counts them, the directive included, go long): %s", threshold, strings.Join(parts, "; "))
	idle := "not within 1m"
	if fs.IdleAfter >= 0 {
		idle = fmt.Sprintf("idle %s after the replay", fs.IdleAfter.Round(1e6))
	}
	var left []string
	for _, p := range fs.Final {
		left = append(left, fmt.Sprintf("%s %d in use, %d waiting", p.Pool, p.InUse, p.Waiting))
	}
	sh.Linef("Sluice's pools afterwards: %s (%s)", strings.Join(left, "; "), idle)
}

// writePrompts says how near the prompts came to their recorded lengths
// and whether the answers had theirs.
func writePrompts(sh Sheet, run *Run) {
	exact, short, extra := 0, 0, 0
	for i, row := range run.Rows {
		switch d := run.SimPrompt[i] - row.Prompt; {
		case d == 0:
			exact++
		case row.Prompt < run.Framing:
			short++
			extra += d
		}
	}
	sh.Linef("prompts: %d of %d exactly their recorded length as the simulator counts them (tiktoken cl100k_base with OpenAI's chat framing); "+
		"%d recorded shorter than the framing's %d tokens have the framing alone (%d tokens more in all); Sluice counts up to %d tokens more in each (the answer-length directive)",
		exact, len(run.Rows), short, run.Framing, extra, directiveExtra(run))
	for _, fs := range run.Systems {
		wrong := 0
		for i, o := range fs.Outcomes {
			if o.Kind == Done && o.OutputUsage != run.Rows[i].Output {
				wrong++
			}
		}
		sh.Linef("%s: answers done with other than their recorded output length: %d", fs.Label, wrong)
	}
}

// WriteGoals writes the admission cost of a request and the goals of
// the workloads that ran with Sluice (and FCFS, for real).
func WriteGoals(sh Sheet, runs []*Run, o Options) {
	sh.Linef("")
	sh.Linef("admission cost of a request in Sluice's fair queue and waiting room: its prompt as Sluice counts it / %d (admission.TokenCost) when it takes its place "+
		"in the fair order (at the door if it waits there), then each output token × %g / %d as it streams (admission.output_token_weight %g; charged each keep-alive round, "+
		"what is left settled with the tokens the answer used when its permit comes back), its tenant's waiting requests moving later with each charge; "+
		"max_tokens is not charged; tenants at equal weight",
		admission.TokensPerCost, o.OutputWeight, admission.TokensPerCost, o.OutputWeight)
	match := VTCUnknown
	if o.LengthKnown() {
		match = VTCKnown
	}
	sh.Linef("Sluice %s the answers' lengths (max_tokens %s): its results are set beside the paper's row %q",
		map[bool]string{true: "knew", false: "did not know"}[o.LengthKnown()], o.MaxTokensMode, match)
	for _, run := range runs {
		if sl := run.System(Sluice); sl != nil {
			writeGoals(sh, run, sl, run.System(FCFS), match)
		}
	}
}

// writeGoals is one workload's goals against the paper's row match, and,
// unless that is the known-length row, against it as the aim.
func writeGoals(sh Sheet, run *Run, sl, fcfs *System, match string) {
	w := run.Workload
	rows := []string{match}
	if match != VTCKnown {
		rows = append(rows, VTCKnown)
	}
	for i, name := range rows {
		p, ok := w.Row(name)
		if !ok {
			continue
		}
		against := "goal"
		if i > 0 {
			against = "aim"
		}
		switch w.Name {
		case "overload":
			acc := lastOf(sl.Result.AccDiff)
			sh.Goal(fmt.Sprintf("overload: Sluice's accumulated difference at the last reading (%s: the paper's %s)", against, name),
				fmt.Sprintf("%.0f", acc), fmt.Sprintf("<= %.0f", p.AccDiff), acc <= p.AccDiff)
		case "real":
			if fcfs == nil {
				continue
			}
			a, b, paperFCFS := sl.Result, fcfs.Result, w.Paper[0]
			maxShare, avgShare := p.MaxDiff/paperFCFS.MaxDiff, p.AvgDiff/paperFCFS.AvgDiff
			sh.Goal(fmt.Sprintf("real: Max Diff, Sluice / FCFS (%s: the paper's %s, %.1f / %.1f)", against, name, p.MaxDiff, paperFCFS.MaxDiff),
				fmt.Sprintf("%.1f / %.1f = %.2f×", a.MaxDiff, b.MaxDiff, safeRatio(a.MaxDiff, b.MaxDiff)), fmt.Sprintf("<= %.2f×", maxShare), a.MaxDiff <= maxShare*b.MaxDiff)
			sh.Goal(fmt.Sprintf("real: Avg Diff, Sluice / FCFS (%s: the paper's %s, %.1f / %.1f)", against, name, p.AvgDiff, paperFCFS.AvgDiff),
				fmt.Sprintf("%.1f / %.1f = %.2f×", a.AvgDiff, b.AvgDiff, safeRatio(a.AvgDiff, b.AvgDiff)), fmt.Sprintf("<= %.2f×", avgShare), a.AvgDiff <= avgShare*b.AvgDiff)
		}
	}
	if fcfs != nil {
		a, b := sl.Result.Throughput, fcfs.Result.Throughput
		sh.Goal(w.Name+": throughput, Sluice / FCFS", fmt.Sprintf("%.0f / %.0f = %.3f×", a, b, safeRatio(a, b)),
			fmt.Sprintf(">= %.2f×", tputShare), a >= tputShare*b)
	}
}

// GoalLine is a goal as a line: what was measured, the goal, met or
// MISSED.
func GoalLine(what, measured, want string, met bool) string {
	verdict := "met"
	if !met {
		verdict = "MISSED"
	}
	return fmt.Sprintf("%s: %s (goal %s) — %s", what, measured, want, verdict)
}

// directiveExtra is the most tokens Sluice counted beyond the simulator
// in one prompt.
func directiveExtra(run *Run) int {
	most := 0
	for i := range run.Rows {
		most = max(most, run.SluicePrompt[i]-run.SimPrompt[i])
	}
	return most
}

// Summary is a system's one-line result, for a log as it ends.
func (fs *System) Summary() string {
	r := fs.Result
	last := 0.0
	if len(r.AccDiff) > 0 {
		last = r.AccDiff[len(r.AccDiff)-1]
	}
	return fmt.Sprintf("accumulated difference %.0f, Max Diff %.1f, Avg Diff %.1f, throughput %.0f tok/s; %s", last, r.MaxDiff, r.AvgDiff, r.Throughput, fs.OutcomeCounts())
}

// OutcomeCounts is how the requests ended, most frequent first.
func (fs *System) OutcomeCounts() string {
	counts := map[string]int{}
	partial := 0
	for _, o := range fs.Outcomes {
		k := o.Kind
		if k == "" {
			k = "not sent"
		}
		counts[k]++
		if o.Kind == Cut && o.Tokens > 0 {
			partial++
		}
	}
	kinds := make([]string, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		return counts[kinds[i]] > counts[kinds[j]] || counts[kinds[i]] == counts[kinds[j]] && kinds[i] < kinds[j]
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, counts[k])
		if k == Cut {
			parts[i] += fmt.Sprintf(" (%d of them mid-answer)", partial)
		}
	}
	return "requests: " + strings.Join(parts, ", ")
}

func lastOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return xs[len(xs)-1]
}

func safeRatio(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return a / b
}

// joinFloats formats xs, each plus offset.
func joinFloats(xs []float64, format string, offset float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x+offset)
	}
	return strings.Join(parts, ", ")
}
