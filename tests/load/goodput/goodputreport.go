package goodput

import (
	"bytes"
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/figure"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// What a step measured, and the report: tables on stdout and in
// goodput.md, a row a step in goodput.csv, the curves in goodput.png.

func (s *goodputStep) label() string {
	if s.loop == loopClosed {
		return fmt.Sprintf("closed %g× (%d clients) %s", s.mult, s.clients, s.system)
	}
	return fmt.Sprintf("open %g× (%.1f/s) %s", s.mult, s.rate, s.system)
}

// load is the load column: the multiple and what it offered.
func (s *goodputStep) load() string {
	if s.loop == loopClosed {
		return fmt.Sprintf("%g× = %d clients", s.mult, s.clients)
	}
	return fmt.Sprintf("%g× = %.1f/s (%.1f/s arrived)", s.mult, s.rate, float64(s.arrivals)/s.window.Seconds())
}

// offered is the load as a number: clients, or arrivals/s asked for.
func (s *goodputStep) offered() float64 {
	if s.loop == loopClosed {
		return float64(s.clients)
	}
	return s.rate
}

func (s *goodputStep) done() int {
	n := 0
	for _, r := range s.reqs {
		if r.Kind == chat.KindDone {
			n++
		}
	}
	return n
}

// goodput is the answers completed per second of the window.
func (s *goodputStep) goodput() float64 { return float64(s.done()) / s.window.Seconds() }

// ttft is the sorted times to first token of the completed answers.
func (s *goodputStep) ttft() stats.Latencies {
	var ds []time.Duration
	for _, r := range s.reqs {
		if r.Kind == chat.KindDone {
			ds = append(ds, r.TTFT)
		}
	}
	return stats.Sorted(ds)
}

// answerTimes is the sorted answer times (from the send to the done
// event) of the completed answers.
func (s *goodputStep) answerTimes() stats.Latencies {
	var ds []time.Duration
	for _, r := range s.reqs {
		if r.Kind == chat.KindDone {
			ds = append(ds, r.took)
		}
	}
	return stats.Sorted(ds)
}

// goodputIn is the answers per second of the window that met slo
// (slo.Tier.Meets, the slo benchmark's judgement).
func (s *goodputStep) goodputIn(slo slo.Tier) float64 {
	n := 0
	for _, r := range s.reqs {
		if slo.Meets(r.Result) {
			n++
		}
	}
	return float64(n) / s.window.Seconds()
}

// kindClientTimeout is how the report names chat.KindHang: here the client
// gave up, as clients do.
const kindClientTimeout = "client timeout"

const kindShedByClient = "shed by client"

// outcomes counts the step's requests by outcome, arrivals the client
// shed included.
func (s *goodputStep) outcomes() map[string]int {
	m := map[string]int{}
	for _, r := range s.reqs {
		k := r.Kind
		if k == chat.KindHang {
			k = kindClientTimeout
		}
		m[k]++
	}
	if s.shed > 0 {
		m[kindShedByClient] = s.shed
	}
	return m
}

// workflows is how many of the step's requests started a workflow.
func (s *goodputStep) workflows() int {
	n := 0
	for _, r := range s.reqs {
		if r.ID != "" {
			n++
		}
	}
	return n
}

// perDone divides by the completed answers (0 when there were none).
func (s *goodputStep) perDone(x float64) float64 {
	if d := s.done(); d > 0 {
		return x / float64(d)
	}
	return 0
}

// wftPerDone is the workflow tasks of the step per completed answer: the
// sample's mean per workflow times the step's workflows, so that the
// tasks of requests that did not complete are charged to those that did.
func (s *goodputStep) wftPerDone() float64 {
	return s.perDone(s.hist.all().per(func(c histCounts) int { return c.workflowTasks }) * float64(s.workflows()))
}

// othersShare is the CPU that processes outside the bench's own tree
// used within the window, in percent of one core.
func (s *goodputStep) othersShare() string {
	return fmt.Sprintf("%.0f%%", 100*s.cpu.others/s.window.Seconds())
}

func (s *goodputStep) summary(slo slo.Tier) string {
	l, a := s.ttft(), s.answerTimes()
	return fmt.Sprintf("goodput %.2f/s (%.2f/s within the %s SLO), TTFT p50 %s p99 %s, answer p50 %s p99 %s, outcomes: %s; Temporal %.3f CPU-s/done, %.2f workflow tasks/done; other processes %s of a core",
		s.goodput(), s.goodputIn(slo), slo.Name, stats.Ms(l.At(50)), stats.Ms(l.At(99)), stats.Ms(a.At(50)), stats.Ms(a.At(99)), report.OutcomeLine(s.outcomes()), s.perDone(s.cpu.temporal), s.wftPerDone(), s.othersShare())
}

func (g *goodputScenario) Report(r *report.Report) error {
	r.Strict = g.strict
	settings := door.ChatSettings(g.cfg, g.cfg.Limits.Tiers[g.cfg.Limits.DefaultTier])
	r.Header(fmt.Sprintf("goodput against offered load, Sluice (POST /v1/chat, every SSE event read) and the bare workflow of its shape (4 no-op local activities, then one activity streaming the same prompt from the same simulator into a Redis stream and writing done itself; started with eager start, read with XREAD) on one stack: closed loop at %s × P clients, then open loop (Poisson) at %s × %.2f/s (%s), at most %d requests in flight; each step %v warm-up + %v measured, Sluice first, then the bare workflow; P = %d permits of the short pool, %d-token answers, rate limits off, healing %s; an anonymous caller (one tenant, tier %s: max_wait %v, fast_wait %v, recheck %v); simulator: one replica running %d sequences; clients give up after %v",
		g.closed, g.open, g.measured, g.capacitySource(), g.maxInFlight, g.warmup, g.step, g.permits, g.maxTokens, onOff(g.healing),
		g.cfg.Limits.DefaultTier, settings.MaxWait, settings.FastWait, settings.RecheckInterval, g.permits, g.timeout))
	r.Table("loop", "load", "system", "goodput (done/s)", "within SLO (/s)", "TTFT p50", "TTFT p99", "answer p50", "answer p99", "done", "other outcomes", "Temporal CPU-s / done", "workflow tasks / done", "other processes' CPU")
	for _, s := range g.steps {
		l, a := s.ttft(), s.answerTimes()
		others := s.outcomes()
		delete(others, chat.KindDone)
		r.Row(s.loop, s.load(), s.system, fmt.Sprintf("%.2f", s.goodput()), fmt.Sprintf("%.2f", s.goodputIn(g.slo)), stats.Ms(l.At(50)), stats.Ms(l.At(99)), stats.Ms(a.At(50)), stats.Ms(a.At(99)), fmt.Sprint(s.done()),
			cmp.Or(report.OutcomeLine(others), "none"), fmt.Sprintf("%.3f", s.perDone(s.cpu.temporal)), fmt.Sprintf("%.2f", s.wftPerDone()), s.othersShare())
	}
	r.Linef("")
	r.Linef("Goodput counts the answers done within each step's window, TTFT (from the POST, or the bare workflow's start call, to the first token) and answer time (to the done event) are theirs, as the client saw them; within SLO counts those that met the slo benchmark's %s tier's SLO (%s), per second of the window. Temporal CPU-s / done: the dev server's CPU seconds in the window over those answers; workflow tasks / done: the history sample's tasks per workflow times the step's workflows, over the answers; other processes' CPU: what ran on the machine outside this process tree, in percent of a core. Shed by client: open-loop arrivals not sent because %d requests were in flight.", g.slo.Name, g.slo.Goal(), g.maxInFlight)
	r.Linef("")
	r.Linef("Per request, from the histories of a sample of each step's workflows (up to %d): admitted at once / queued (a queue event on its stream, the admitted signal or a re-check timer in its history); actions as Temporal Cloud bills them.", g.histories)
	r.Linef("")
	g.historyTable(r)
	r.Linef("")
	for _, gl := range goodputGoals(g.steps, g.closedList) {
		r.Goal(gl.What, gl.Measured, gl.Want, gl.Met)
	}
	return writeGoodputReport(g, r)
}

func (g *goodputScenario) capacitySource() string {
	if g.capacity > 0 {
		return "-capacity"
	}
	return "Sluice's goodput at P clients"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// historyFields are the history counts the report shows, in order.
var historyFields = []struct {
	name string
	get  func(histCounts) int
}{
	{"events", func(c histCounts) int { return c.events }},
	{"workflow tasks", func(c histCounts) int { return c.workflowTasks }},
	{"timers", func(c histCounts) int { return c.timers }},
	{"signals", func(c histCounts) int { return c.signals }},
	{"activities", func(c histCounts) int { return c.activities }},
	{"actions", func(c histCounts) int { return c.actions }},
}

// historyTable adds a row a step: the sample's size and each count per
// request, admitted at once / queued.
func (g *goodputScenario) historyTable(r *report.Report) {
	cols := []string{"loop", "load", "system", "histories (at once / queued)"}
	for _, f := range historyFields {
		cols = append(cols, f.name)
	}
	r.Table(cols...)
	for _, s := range g.steps {
		row := []string{s.loop, s.load(), s.system, fmt.Sprintf("%d / %d", s.hist.once.n, s.hist.queued.n)}
		if s.hist.failed > 0 {
			row[3] += fmt.Sprintf(" (%d unreadable)", s.hist.failed)
		}
		for _, f := range historyFields {
			row = append(row, perPair(s.hist, f.get))
		}
		r.Row(row...)
	}
}

// perPair is a count per request, at once / queued; "—" for an empty half.
func perPair(h histSummary, get func(histCounts) int) string {
	half := func(a histAgg) string {
		if a.n == 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f", a.per(get))
	}
	return half(h.once) + " / " + half(h.queued)
}

// goodputGoals judges the steps: Sluice at P clients against the bare
// workflow at P clients, Sluice above P clients against itself at P, and
// what queueing adds to a request's history.
func goodputGoals(steps []*goodputStep, closed []float64) []report.Goal {
	find := func(mult float64, system string) *goodputStep {
		for _, s := range steps {
			if s.loop == loopClosed && s.mult == mult && s.system == system {
				return s
			}
		}
		return nil
	}
	var out []report.Goal
	one, bare := find(1, sysSluice), find(1, sysBare)
	if one != nil && bare != nil {
		out = append(out, report.NewGoal("closed loop at P clients: Sluice's goodput / the bare workflow's",
			fmt.Sprintf("%.2f/s / %.2f/s = %.2f×", one.goodput(), bare.goodput(), stats.Ratio(one.goodput(), bare.goodput())), ">= 0.8×",
			one.goodput() >= 0.8*bare.goodput()))
	}
	for _, m := range closed {
		if s := find(m, sysSluice); m > 1 && s != nil && one != nil {
			out = append(out, report.NewGoal(fmt.Sprintf("closed loop at %g× P clients: Sluice's goodput / its goodput at P clients", m),
				fmt.Sprintf("%.2f/s / %.2f/s = %.2f×", s.goodput(), one.goodput(), stats.Ratio(s.goodput(), one.goodput())), ">= 0.9×",
				s.goodput() >= 0.9*one.goodput()))
		}
	}
	return append(out, queueingGoal(steps))
}

// queueingGoal compares what a queued Sluice request costs with what one
// admitted at once costs (pooled over all steps): in the step where
// queueing costs most, at most one more signal, timer and workflow task.
func queueingGoal(steps []*goodputStep) report.Goal {
	what := "a queued Sluice request over one admitted at once (the step where queueing costs most)"
	want := "<= +1 signal, +1 timer, +1 workflow task"
	var once histAgg
	for _, s := range steps {
		if s.system == sysSluice {
			once.n += s.hist.once.n
			once.sum.add(s.hist.once.sum)
		}
	}
	type deltas struct{ sig, tim, wft, act, events float64 }
	var worst *goodputStep
	var w deltas
	for _, s := range steps {
		q := s.hist.queued
		if s.system != sysSluice || q.n == 0 || once.n == 0 {
			continue
		}
		d := func(get func(histCounts) int) float64 { return q.per(get) - once.per(get) }
		ds := deltas{d(func(c histCounts) int { return c.signals }), d(func(c histCounts) int { return c.timers }), d(func(c histCounts) int { return c.workflowTasks }),
			d(func(c histCounts) int { return c.actions }), d(func(c histCounts) int { return c.events })}
		if worst == nil || max(ds.sig, ds.tim, ds.wft) > max(w.sig, w.tim, w.wft) {
			worst, w = s, ds
		}
	}
	if worst == nil {
		return report.NewGoal(what, fmt.Sprintf("not measured: no step with both kinds sampled (%d admitted at once)", once.n), want, false)
	}
	// Three decimals: one request in a sample of 200 with a second timer
	// is +0.005, and must not read as +1.00 beside a missed goal.
	return report.NewGoal(what, fmt.Sprintf("%s: %+.3f signals, %+.3f timers, %+.3f workflow tasks (%+.2f actions, %+.1f events)", worst.label(), w.sig, w.tim, w.wft, w.act, w.events),
		want, w.sig <= 1 && w.tim <= 1 && w.wft <= 1)
}

// csvOutcomes are the outcome columns of goodput.csv, each with the
// outcome kinds it counts; "other" counts the rest.
var csvOutcomes = []struct {
	column string
	match  func(kind string) bool
}{
	{"done", func(k string) bool { return k == chat.KindDone }},
	{"rejected_queue_timeout", func(k string) bool { return k == "rejected "+request.ReasonQueueTimeout }},
	{"rejected_queue_full", func(k string) bool { return k == "rejected "+request.ReasonQueueFull }},
	{"rejected_tenant_queue_full", func(k string) bool { return k == "rejected "+request.ReasonTenantQueueFull }},
	{"rejected_shed", func(k string) bool { return k == "rejected "+request.ReasonShed }},
	{"rejected_other", func(k string) bool { return strings.HasPrefix(k, "rejected ") }},
	{"error_events", func(k string) bool { return strings.HasPrefix(k, "error ") }},
	{"http_503_busy", func(k string) bool { return k == "HTTP 503 "+request.ReasonBusy }},
	{"http_other", func(k string) bool { return strings.HasPrefix(k, "HTTP ") }},
	{"transport_errors", func(k string) bool { return k == "transport error" }},
	{"client_timeouts", func(k string) bool { return k == kindClientTimeout }},
	{"shed_by_client", func(k string) bool { return k == kindShedByClient }},
	{"other", func(string) bool { return true }},
}

// csvRow is a step's row of goodput.csv.
func csvRow(s *goodputStep, slo slo.Tier) []string {
	l, a := s.ttft(), s.answerTimes()
	arrived := ""
	if s.loop == loopOpen {
		arrived = fmt.Sprintf("%.3f", float64(s.arrivals)/s.window.Seconds())
	}
	row := []string{s.loop, fmt.Sprint(s.mult), s.system, fmt.Sprintf("%.3f", s.offered()), arrived,
		fmt.Sprintf("%.0f", s.window.Seconds()), fmt.Sprintf("%.3f", s.goodput()), fmt.Sprintf("%.1f", stats.Millis(l.At(50))), fmt.Sprintf("%.1f", stats.Millis(l.At(99))),
		fmt.Sprintf("%.1f", stats.Millis(a.At(50))), fmt.Sprintf("%.1f", stats.Millis(a.At(99))), fmt.Sprintf("%.3f", s.goodputIn(slo))}
	counts := make([]int, len(csvOutcomes))
	for kind, n := range s.outcomes() {
		for i, c := range csvOutcomes {
			if c.match(kind) {
				counts[i] += n
				break
			}
		}
	}
	for _, n := range counts {
		row = append(row, fmt.Sprint(n))
	}
	row = append(row, fmt.Sprintf("%.4f", s.perDone(s.cpu.temporal)), fmt.Sprintf("%.3f", s.wftPerDone()), fmt.Sprintf("%.3f", s.cpu.others/s.window.Seconds()),
		fmt.Sprint(s.hist.once.n), fmt.Sprint(s.hist.queued.n))
	for _, half := range []histAgg{s.hist.once, s.hist.queued} {
		for _, f := range historyFields {
			cell := ""
			if half.n > 0 {
				cell = fmt.Sprintf("%.3f", half.per(f.get))
			}
			row = append(row, cell)
		}
	}
	return row
}

// csvHeader names csvRow's columns.
func csvHeader() []string {
	h := []string{"loop", "multiple", "system", "offered", "arrivals_per_s", "window_s", "goodput_per_s", "ttft_p50_ms", "ttft_p99_ms",
		"answer_p50_ms", "answer_p99_ms", "goodput_in_slo_per_s"}
	for _, c := range csvOutcomes {
		h = append(h, c.column)
	}
	h = append(h, "temporal_cpu_s_per_done", "workflow_tasks_per_done", "other_processes_cores", "histories_at_once", "histories_queued")
	for _, half := range []string{"at_once", "queued"} {
		for _, f := range historyFields {
			h = append(h, strings.ReplaceAll(f.name, " ", "_")+"_"+half)
		}
	}
	return h
}

// writeGoodputReport writes goodput.md (the report's lines under a title,
// the command and the machine), goodput.csv and goodput.png (drawn from
// goodput.csv) under -out.
func writeGoodputReport(g *goodputScenario, r *report.Report) error {
	if err := os.MkdirAll(g.out, 0o755); err != nil {
		return fmt.Errorf("report directory: %w", err)
	}
	var md, csv bytes.Buffer
	md.WriteString("# Goodput under overload (sluice-bench goodput)\n\n")
	fmt.Fprintf(&md, "Generated by `sluice-bench goodput` (`make bench-goodput`) on %s.\n\n", time.Now().UTC().Format(time.DateOnly))
	md.WriteString(report.RunLine() + "\n\n")
	fmt.Fprintf(&md, "Command: `%s`\n\n", report.CommandLine())
	fmt.Fprintf(&md, "Machine: %s; load average %s at the start, %s at the end. Everything (the bench's clients, the API and its worker, the bare workflow's worker, Redis, the Temporal dev server, the simulator) runs on it.\n\n", fmt.Sprintf("%d CPUs", runtime.NumCPU()), report.LoadAtStart(), testenv.LoadAverage())
	fmt.Fprintf(&md, "What ran: %s.\n\n", r.What)
	md.WriteString("![goodput and TTFT p99 against offered load](goodput.png)\n\n")
	for _, l := range r.Lines {
		md.WriteString(l + "\n")
	}
	csv.WriteString(strings.Join(csvHeader(), ",") + "\n")
	for _, s := range g.steps {
		csv.WriteString(strings.Join(csvRow(s, g.slo), ",") + "\n")
	}
	if err := os.WriteFile(filepath.Join(g.out, "goodput.md"), md.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(g.out, "goodput.csv"), csv.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	png := filepath.Join(g.out, "goodput.png")
	figure.DrawBeside("goodput", png, func() error { return plotGoodputCSV(filepath.Join(g.out, "goodput.csv"), png) })
	return nil
}
