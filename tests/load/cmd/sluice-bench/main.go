// Command sluice-bench measures Sluice against the goals of its traffic
// protection, each scenario a subcommand that starts what it needs
// (redis-server, the pinned Temporal dev server, the LLM simulator and a
// full API process with its embedded worker, all on loopback) and prints a
// markdown table, one line per goal with the measured value beside it, and
// the command that produced them:
//
//	overhead  (the default) what Sluice adds on top of the LLM, against a
//	          bare Temporal workflow of the same shape
//	limiter   token-bucket decisions/s of limiter.Reserve vs redis-benchmark
//	          SET on the same server, then p99 latency at half that rate
//	reject    the 429 path through the HTTP API: rejections/s and latency,
//	          with no workflow started
//	wakeup    permit release → the next waiter's retrieval stage on its SSE
//	          stream, end to end
//	burst     2,000 concurrent SSE clients against 20 permits: every client
//	          gets an answer, none hangs, no permit leaks
//	waiters   10,000 queued chat workflows on one worker: memory and
//	          goroutines, then drained with nothing leaked
//	heal      80% short / 20% long requests on one simulator, healing off
//	          then on: the short pool's P99/P50 over time
//	goodput   answers completed per second and TTFT against offered load,
//	          closed and open loop, Sluice beside a bare workflow of its
//	          shape; what a request costs Temporal, admitted or queued
//	pools     two equal-weight tenants backlogged, one asking long
//	          questions, one short, on pools that share the simulator and
//	          on pools apart: token shares and TTFT where clients stand
//	slo       SLO attainment by tier (interactive weight 5, batch 1)
//	          under 0.5×–2× the capacity, Sluice with healing off and
//	          on beside FCFS straight to the simulator, same arrivals
//	soak      make run's shape (API and worker as processes) at the
//	          pool's capacity for 30 minutes: memory, goroutines and
//	          workflow caches of every process level off, under the
//	          Helm chart's limits
//	fairness  the VTC paper's workloads (OSDI 2024) replayed through
//	          Sluice and straight to the simulator (FCFS): the paper's
//	          service differences and throughput, beside its numbers
//
// and one command that runs no scenario:
//
//	plot      redraws a report's PNG from its CSV (plotcmd.go)
//
// Every scenario has the same skeleton (scenario.go): its flags, the
// stacks it starts (stack.go), the load it drives, and a report with its
// goals (report.go); while it runs, a progress line on stderr every few
// seconds (progress.go). Run `sluice-bench <scenario> -h` for a scenario's
// flags. Without a scenario name the overhead benchmark runs, so
// `sluice-bench -n 200` is `sluice-bench overhead -n 200`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"

	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/pkg/version"
)

// scenarios are the subcommands: a summary for the usage, and a new
// scenario to bind the flags to.
var scenarios = map[string]struct {
	summary string
	new     func() scenario
}{
	"overhead": {"what Sluice adds on top of the LLM, vs a bare Temporal workflow (default)", func() scenario { return &overheadScenario{} }},
	"limiter":  {"limiter.Reserve decisions/s vs redis-benchmark SET; p99 at half that rate", func() scenario { return &limiterScenario{} }},
	"reject":   {"429 path through POST /v1/chat: rejections/s, latency, no workflow started", func() scenario { return &rejectScenario{} }},
	"wakeup":   {"permit release to the next waiter's retrieval stage, end to end", func() scenario { return &wakeupScenario{} }},
	"burst":    {"2,000 concurrent SSE clients against 20 permits: outcomes, hangs, leaks", func() scenario { return &burstScenario{} }},
	"waiters":  {"10,000 queued workflows on one worker: RSS, goroutines, drain", func() scenario { return &waitersScenario{} }},
	"heal":     {"80% short / 20% long on one simulator, healing off then on: short P99/P50 over time", func() scenario { return &healScenario{} }},
	"goodput":  {"goodput and TTFT against offered load, closed and open loop, Sluice vs a bare workflow", func() scenario { return &goodputScenario{} }},
	"soak":     {"30 minutes at the pool's capacity: every process's memory, goroutines and workflow cache level off", func() scenario { return &soakScenario{} }},
	"slo":      {"SLO attainment by tier at 0.5×–2× capacity: Sluice healing off/on vs FCFS straight to the simulator", func() scenario { return &sloScenario{} }},
	"pools":    {"two equal tenants, one per pool, on make run's shared pools vs pools apart: token shares, TTFT", func() scenario { return &poolsScenario{} }},
	"fairness": {"the VTC paper's workloads replayed: token fairness of Sluice vs FCFS vs the paper's numbers", func() scenario { return &fairnessScenario{} }},
}

func main() {
	if version.Asked(os.Args[1:]) {
		fmt.Println(version.Line("sluice-bench"))
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "plot" {
		err := runPlot(os.Args[2:])
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "sluice-bench plot: %v\n", err)
			os.Exit(1)
		}
		return
	}
	name, args := scenarioName(os.Args[1:])
	fs := flag.NewFlagSet("sluice-bench "+name, flag.ExitOnError)
	fs.Usage = func() {
		usage()
		fmt.Fprintf(os.Stderr, "\nflags of %s:\n", name)
		fs.PrintDefaults()
	}
	run := bind(name, scenarios[name].new(), fs)
	temporalBin := fs.String("temporal", "", "Temporal CLI (default: bin/temporal or $SLUICE_TEST_TEMPORAL_BIN)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (bench, API and worker share the process)")
	copyTo := fs.String("report", "", "also write the report to this file (make bench-<scenario>: tests/load/report/<scenario>.md)")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sluice-bench %s: unexpected arguments %v\n", name, fs.Args())
		os.Exit(2)
	}
	if *temporalBin != "" {
		os.Setenv("SLUICE_TEST_TEMPORAL_BIN", *temporalBin)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer f.Close()
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	// Ctrl-C ends the run cleanly, so that redis-server and the Temporal
	// dev server are stopped with it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	begin(*copyTo)
	// OTEL_* turn tracing on for the stack the bench runs, as they do for
	// the binaries: the overhead scenario then measures its cost.
	stopTracing, err := tracing.Start(ctx, "sluice-bench", slog.Default())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer func() { _ = stopTracing(context.Background()) }()
	if err := run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "sluice-bench %s: %v\n", name, err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// scenarioName splits the scenario's name off the arguments (overhead
// when they start with a flag); help and unknown names end the program.
func scenarioName(args []string) (string, []string) {
	name := "overhead"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if name == "help" {
		usage()
		os.Exit(0)
	}
	if _, ok := scenarios[name]; !ok {
		fmt.Fprintf(os.Stderr, "sluice-bench: unknown scenario %q\n\n", name)
		usage()
		os.Exit(2)
	}
	return name, args
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sluice-bench [scenario] [flags]   (scenario defaults to overhead; sluice-bench <scenario> -h lists its flags)")
	names := make([]string, 0, len(scenarios))
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", n, scenarios[n].summary)
	}
	fmt.Fprintf(os.Stderr, "or: sluice-bench plot -in <csv> [-out <png>]\n  %-9s %s\n", "plot", plotSummary)
}
