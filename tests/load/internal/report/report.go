package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// report is what a scenario prints on stdout: a header (what ran, the
// command that ran it, the machine it ran on), then its lines — a
// markdown table, notes, goal lines — in the order they were added.
type report struct {
	name string
	// what is the header's account of the run; empty, there is no header.
	what  string
	lines []string
	goals []goal
	// strict makes a missed goal fail the run (exit status 1); otherwise
	// goals are reported only, so that one noisy scenario does not stop
	// the others of make bench.
	strict bool
}

// goal is one goal: what was measured, the goal, and whether it was met.
// An advisory goal is reported but never fails a strict report.
type goal struct {
	what, measured, want string
	met                  bool
	advisory             bool
}

func (g goal) String() string {
	verdict := "met"
	if !g.met {
		verdict = "MISSED"
	}
	if g.advisory {
		verdict += " (reported, not asserted)"
	}
	return fmt.Sprintf("%s: %s (goal %s) — %s", g.what, g.measured, g.want, verdict)
}

// header sets the header, which comes first whenever it is set.
func (r *report) header(what string) { r.what = what }

// table starts a markdown table with its column names.
func (r *report) table(columns ...string) {
	r.row(columns...)
	r.lines = append(r.lines, "|"+strings.Repeat("---|", len(columns)))
}

// row adds a table row.
func (r *report) row(cells ...string) {
	var b strings.Builder
	b.WriteString("|")
	for _, c := range cells {
		if c != "" {
			b.WriteString(" " + c)
		}
		b.WriteString(" |")
	}
	r.lines = append(r.lines, b.String())
}

// linef adds a line of text.
func (r *report) linef(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

// goal adds a goal line.
func (r *report) goal(what, measured, want string, met bool) {
	r.add(goal{what: what, measured: measured, want: want, met: met})
}

// add adds g's line.
func (r *report) add(g goal) {
	r.goals = append(r.goals, g)
	r.lines = append(r.lines, g.String())
}

// print writes the report to stdout, and to reportPath when set; a
// strict report with a missed goal is an error.
func (r *report) print() error {
	var b strings.Builder
	if r.what != "" {
		fmt.Fprintf(&b, "sluice-bench %s: %s\n", r.name, r.what)
		fmt.Fprintf(&b, "command: %s\n", commandLine())
		b.WriteString(runLine() + "\n")
		fmt.Fprintf(&b, "machine: %d CPUs; load average %s at the start, %s at the end\n\n", runtime.NumCPU(), startLoad, testenv.LoadAverage())
	}
	for _, l := range r.lines {
		b.WriteString(l + "\n")
	}
	fmt.Print(b.String())
	if reportPath != "" {
		// A fenced block: the report's table and goal lines read as they
		// printed.
		md := "# sluice-bench " + r.name + "\n\n```\n" + b.String() + "```\n"
		if err := os.WriteFile(reportPath, []byte(md), 0o644); err != nil {
			return fmt.Errorf("write the report: %w", err)
		}
	}
	if !r.strict {
		return nil
	}
	for _, g := range r.goals {
		if !g.met && !g.advisory {
			return errors.New("goal missed")
		}
	}
	return nil
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

// The run every report tells of: when it started, the machine's load
// average then (other processes on a 2-core machine move every number
// here), and the file that gets a copy of the report (-report: the
// published one, under tests/load/report/, which docs quote).
var (
	startTime  time.Time
	startLoad  string
	reportPath string
)

// begin notes that the run starts now; copyTo, if set, gets a copy of
// the report.
func begin(copyTo string) {
	startTime, startLoad, reportPath = time.Now(), testenv.LoadAverage(), copyTo
}

// runLine is the report's run line: its date and the build that ran.
func runLine() string { return testenv.RunLine(startTime) }

// loadAtStart is the machine's load average when the run started.
func loadAtStart() string { return startLoad }

// newGoal is a goal that a strict report asserts.
func newGoal(what, measured, want string, met bool) goal {
	return goal{what: what, measured: measured, want: want, met: met}
}

func outcomeLine(m map[string]int) string {
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
