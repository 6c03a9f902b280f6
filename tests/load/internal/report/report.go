// Package report writes a scenario's report: a header saying what ran,
// how, when and on what machine, then tables, notes and one line per
// goal with its verdict, printed on stdout and copied to -report's file.
package report

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

// Report is what a scenario prints on stdout: a header (what ran, the
// command that ran it, the machine it ran on), then its lines — a
// markdown table, notes, goal lines — in the order they were added.
type Report struct {
	Name string
	// What is the header's account of the run; empty, there is no header.
	What  string
	Lines []string
	Goals []Goal
	// Strict makes a missed goal fail the run (exit status 1); otherwise
	// goals are reported only, so that one noisy scenario does not stop
	// the others of make bench.
	Strict bool
}

// Goal is one goal: what was measured, the goal, and whether it was met.
// An advisory goal is reported but never fails a strict report.
type Goal struct {
	What, Measured, Want string
	Met                  bool
	Advisory             bool
}

func (g Goal) String() string {
	verdict := "met"
	if !g.Met {
		verdict = "MISSED"
	}
	if g.Advisory {
		verdict += " (reported, not asserted)"
	}
	return fmt.Sprintf("%s: %s (goal %s) — %s", g.What, g.Measured, g.Want, verdict)
}

// Header sets the header, which comes first whenever it is set.
func (r *Report) Header(what string) { r.What = what }

// Table starts a markdown table with its column names.
func (r *Report) Table(columns ...string) {
	r.Row(columns...)
	r.Lines = append(r.Lines, "|"+strings.Repeat("---|", len(columns)))
}

// Row adds a table row.
func (r *Report) Row(cells ...string) {
	var b strings.Builder
	b.WriteString("|")
	for _, c := range cells {
		if c != "" {
			b.WriteString(" " + c)
		}
		b.WriteString(" |")
	}
	r.Lines = append(r.Lines, b.String())
}

// Linef adds a line of text.
func (r *Report) Linef(format string, args ...any) {
	r.Lines = append(r.Lines, fmt.Sprintf(format, args...))
}

// Goal adds a goal line.
func (r *Report) Goal(what, measured, want string, met bool) {
	r.Add(Goal{What: what, Measured: measured, Want: want, Met: met})
}

// Add adds g's line.
func (r *Report) Add(g Goal) {
	r.Goals = append(r.Goals, g)
	r.Lines = append(r.Lines, g.String())
}

// Print writes the report to stdout, and to reportPath when set; a
// strict report with a missed goal is an error.
func (r *Report) Print() error {
	var b strings.Builder
	if r.What != "" {
		fmt.Fprintf(&b, "sluice-bench %s: %s\n", r.Name, r.What)
		fmt.Fprintf(&b, "command: %s\n", CommandLine())
		b.WriteString(RunLine() + "\n")
		fmt.Fprintf(&b, "machine: %d CPUs; load average %s at the start, %s at the end\n\n", runtime.NumCPU(), startLoad, testenv.LoadAverage())
	}
	for _, l := range r.Lines {
		b.WriteString(l + "\n")
	}
	fmt.Print(b.String())
	if reportPath != "" {
		// A fenced block: the report's table and goal lines read as they
		// printed.
		md := "# sluice-bench " + r.Name + "\n\n```\n" + b.String() + "```\n"
		if err := os.WriteFile(reportPath, []byte(md), 0o644); err != nil {
			return fmt.Errorf("write the report: %w", err)
		}
	}
	if !r.Strict {
		return nil
	}
	for _, g := range r.Goals {
		if !g.Met && !g.Advisory {
			return errors.New("goal missed")
		}
	}
	return nil
}

// CommandLine is the command as it was run, for the report.
func CommandLine() string {
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

// Begin notes that the run starts now; copyTo, if set, gets a copy of
// the report.
func Begin(copyTo string) {
	startTime, startLoad, reportPath = time.Now(), testenv.LoadAverage(), copyTo
}

// RunLine is the report's run line: its date and the build that ran.
func RunLine() string { return testenv.RunLine(startTime) }

// LoadAtStart is the machine's load average when the run started.
func LoadAtStart() string { return startLoad }

// NewGoal is a goal that a strict report asserts.
func NewGoal(what, measured, want string, met bool) Goal {
	return Goal{What: what, Measured: measured, Want: want, Met: met}
}

func OutcomeLine(m map[string]int) string {
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
