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
//
// Run `sluice-bench <scenario> -h` for a scenario's flags. Without a
// scenario name the overhead benchmark runs, so `sluice-bench -n 200` is
// `sluice-bench overhead -n 200`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
)

// scenario is one subcommand: define registers its flags on fs and returns
// the function that runs it with their parsed values.
type scenario struct {
	summary string
	define  func(fs *flag.FlagSet) func(ctx context.Context) error
}

var scenarios = map[string]scenario{
	"overhead": {"what Sluice adds on top of the LLM, vs a bare Temporal workflow (default)", defineOverhead},
	"limiter":  {"limiter.Reserve decisions/s vs redis-benchmark SET; p99 at half that rate", defineLimiter},
	"reject":   {"429 path through POST /v1/chat: rejections/s, latency, no workflow started", defineReject},
	"wakeup":   {"permit release to the next waiter's retrieval stage, end to end", defineWakeup},
	"burst":    {"2,000 concurrent SSE clients against 20 permits: outcomes, hangs, leaks", defineBurst},
	"waiters":  {"10,000 queued workflows on one worker: RSS, goroutines, drain", defineWaiters},
	"heal":     {"80% short / 20% long on one simulator, healing off then on: short P99/P50 over time", defineHeal},
}

func main() {
	args := os.Args[1:]
	name := "overhead"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	sc, ok := scenarios[name]
	if !ok && name != "help" {
		fmt.Fprintf(os.Stderr, "sluice-bench: unknown scenario %q\n\n", name)
		usage()
		os.Exit(2)
	}
	if name == "help" {
		usage()
		return
	}
	fs := flag.NewFlagSet("sluice-bench "+name, flag.ExitOnError)
	fs.Usage = func() {
		usage()
		fmt.Fprintf(os.Stderr, "\nflags of %s:\n", name)
		fs.PrintDefaults()
	}
	run := sc.define(fs)
	temporalBin := fs.String("temporal", "", "Temporal CLI (default: bin/temporal or $SLUICE_TEST_TEMPORAL_BIN)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (bench, API and worker share the process)")
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
	startLoad = loadAverage()
	if err := run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "sluice-bench %s: %v\n", name, err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
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
}

// commandLine is the command as it was run, for the report.
func commandLine() string {
	parts := make([]string, len(os.Args))
	wd, _ := os.Getwd()
	for i, a := range os.Args {
		// Paths under the working directory (the repository, from make)
		// are shown relative, so a report names the command anyone can run.
		if rel, err := filepath.Rel(wd, a); wd != "" && filepath.IsAbs(a) && err == nil && !strings.HasPrefix(rel, "..") {
			a = rel
		}
		if a == "" || strings.ContainsAny(a, " \t'\"$;&|<>*?") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}

// startLoad is the machine's load average when the scenario started:
// other processes on a 2-core machine move every number here.
var startLoad string

func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// header opens a scenario's report: what ran, the command that ran it,
// and the machine it ran on.
func header(name, what string) {
	fmt.Printf("sluice-bench %s: %s\n", name, what)
	fmt.Printf("command: %s\n", commandLine())
	fmt.Printf("machine: %d CPUs; load average %s at the start, %s at the end\n\n", runtime.NumCPU(), startLoad, loadAverage())
}

// goal prints one goal line: what was measured, the goal, and whether it
// was met.
func goal(what, measured, want string, met bool) {
	verdict := "met"
	if !met {
		verdict = "MISSED"
	}
	fmt.Printf("%s: %s (goal %s) — %s\n", what, measured, want, verdict)
}
