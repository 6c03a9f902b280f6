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
// and two commands that run no scenario:
//
//	plot      redraws a report's PNG from its CSV (plot.go)
//	list      the scenarios' make targets; with -make, the Makefile's
//	          bench targets (tests/load/bench.mk) generated from them
//	          (list.go)
//
// The command is a dispatcher over specs, the list of scenarios. Each
// scenario lives in the package of its family (tests/load/overhead,
// goodput, fairness, heal), which declares it as a scenario.Spec, and
// every scenario has the same skeleton (tests/load/internal/scenario):
// its flags, the stacks it starts (internal/stack), the load it drives,
// and a report with its goals (internal/report); while it runs, a
// progress line on stderr every few seconds (internal/progress). Run
// `sluice-bench <scenario> -h` for a scenario's flags. Without a
// scenario name the overhead benchmark runs, so `sluice-bench -n 200` is
// `sluice-bench overhead -n 200`.
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
	"slices"
	"strings"
	"syscall"

	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/pkg/version"
	"github.com/sluice-dev/sluice/tests/load/fairness"
	"github.com/sluice-dev/sluice/tests/load/goodput"
	"github.com/sluice-dev/sluice/tests/load/heal"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
	"github.com/sluice-dev/sluice/tests/load/overhead"
)

// specs are the scenarios, in the order make bench runs their targets.
var specs = []scenario.Spec{
	overhead.Overhead, overhead.Limiter, overhead.Reject, overhead.Wakeup, goodput.Burst, overhead.Waiters,
	heal.Heal, goodput.Goodput, fairness.Pools, fairness.SLO, fairness.Fairness, goodput.Soak,
}

// specNamed is the scenario of that name.
func specNamed(name string) (scenario.Spec, bool) {
	for _, s := range specs {
		if s.Name == name {
			return s, true
		}
	}
	return scenario.Spec{}, false
}

func main() {
	if version.Asked(os.Args[1:]) {
		fmt.Println(version.Line("sluice-bench"))
		return
	}
	if len(os.Args) > 1 && (os.Args[1] == "plot" || os.Args[1] == "list") {
		command(os.Args[1], os.Args[2:])
		return
	}
	spec, args := scenarioOf(os.Args[1:])
	name := spec.Name
	fs := flag.NewFlagSet("sluice-bench "+name, flag.ExitOnError)
	fs.Usage = func() {
		usage()
		fmt.Fprintf(os.Stderr, "\nflags of %s:\n", name)
		fs.PrintDefaults()
	}
	run := scenario.Bind(name, spec.New(), fs)
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
	report.Begin(*copyTo)
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

// command runs plot or list, which run no scenario.
func command(name string, args []string) {
	run := runPlot
	if name == "list" {
		run = runList
	}
	err := run(args)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice-bench %s: %v\n", name, err)
		os.Exit(1)
	}
}

// scenarioOf splits the scenario's name off the arguments (overhead
// when they start with a flag); help and unknown names end the program.
func scenarioOf(args []string) (scenario.Spec, []string) {
	name := "overhead"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if name == "help" {
		usage()
		os.Exit(0)
	}
	spec, ok := specNamed(name)
	if !ok {
		fmt.Fprintf(os.Stderr, "sluice-bench: unknown scenario %q\n\n", name)
		usage()
		os.Exit(2)
	}
	return spec, args
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sluice-bench [scenario] [flags]   (scenario defaults to overhead; sluice-bench <scenario> -h lists its flags)")
	sorted := slices.Clone(specs)
	slices.SortFunc(sorted, func(a, b scenario.Spec) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sorted {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", s.Name, s.Summary)
	}
	fmt.Fprintf(os.Stderr, "or: sluice-bench plot -in <csv> [-out <png>]\n  %-9s %s\n", "plot", plotSummary())
	fmt.Fprintf(os.Stderr, "or: sluice-bench list [-make]\n  %-9s %s\n", "list", listSummary)
}
