// Package scenario is the skeleton every benchmark scenario shares (its
// flags, the stacks it starts, the load it drives, its report), the run
// that takes those steps in order, and the Spec by which sluice-bench and
// make know a scenario (spec.go).
package scenario

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"

	"github.com/sluice-dev/sluice/tests/load/internal/progress"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
)

// A scenario is one subcommand. Every scenario takes the same steps, in
// the order runScenario runs them: its flags are bound and parsed, it
// names the stacks it needs, each is started fresh and driven in turn,
// and what the drives measured is written into a report against the
// scenario's goals.
type Scenario interface {
	// Flags registers the scenario's flags on fs, bound to its fields.
	Flags(fs *flag.FlagSet)
	// Stacks says what to start once the flags are parsed, rejecting bad
	// values before anything runs: one stack for most scenarios, one a
	// setting when a scenario compares settings on fresh stacks.
	Stacks() ([]stack.Options, error)
	// Drive runs the load on one started stack and keeps what it measured.
	Drive(ctx context.Context, st *stack.Stack) error
	// Status is the progress line while drive runs on st: its phase and
	// the numbers it has at hand. It is called from another goroutine
	// than drive's, so it reads only what is safe to read concurrently,
	// and it must be cheap: it runs every progress.Every.
	Status(st *stack.Stack) string
	// Report writes what was measured, and the goals, into r.
	Report(r *report.Report) error
}

// Bind registers sc's flags on fs and returns the run that uses their
// parsed values: the way main and the tests start a scenario.
func Bind(name string, sc Scenario, fs *flag.FlagSet) func(context.Context) error {
	sc.Flags(fs)
	return func(ctx context.Context) error { return runScenario(ctx, name, sc) }
}

// runScenario starts each stack sc asks for, drives it and stops it, one
// after another. The report is printed while the last stack still runs,
// so that what its API process logged comes after it, as a footnote.
// Throughout, a progress line goes to stderr every progress.Every.
func runScenario(ctx context.Context, name string, sc Scenario) error {
	stacks, err := sc.Stacks()
	if err != nil {
		return err
	}
	var now runStage
	ticker := progress.Start(os.Stderr, name, progress.Every, func() string { return now.line(sc) })
	defer ticker.Stop()
	for i, opts := range stacks {
		last := i == len(stacks)-1
		now.set(fmt.Sprintf("phase=starting-stack stack=%d/%d", i+1, len(stacks)), nil)
		err := onStack(ctx, opts, func(st *stack.Stack) error {
			now.set("", st)
			err := sc.Drive(ctx, st)
			if err == nil && last {
				now.set("phase=report", nil)
				err = printReport(name, sc)
			}
			now.set("phase=stopping-stack", nil)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// printReport has sc write its report, and prints it.
func printReport(name string, sc Scenario) error {
	r := &report.Report{Name: name}
	if err := sc.Report(r); err != nil {
		return err
	}
	return r.Print()
}

// runStage is where runScenario is, for its progress line: a fixed line
// outside drive, or the stack being driven.
type runStage struct {
	mu    sync.Mutex
	fixed string
	st    *stack.Stack
}

func (r *runStage) set(fixed string, st *stack.Stack) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fixed, r.st = fixed, st
}

func (r *runStage) line(sc Scenario) string {
	r.mu.Lock()
	fixed, st := r.fixed, r.st
	r.mu.Unlock()
	if st == nil {
		return fixed
	}
	return sc.Status(st)
}

// onStack runs f on a stack started with opts, and stops the stack after.
func onStack(ctx context.Context, opts stack.Options, f func(st *stack.Stack) error) error {
	st, err := stack.Launch(ctx, opts)
	if err != nil {
		return err
	}
	defer st.Close()
	return f(st)
}
