package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
)

// `sluice-bench list` prints the scenarios' make targets; with -make, the
// Makefile's bench targets, which make includes from tests/load/bench.mk.
// That file is generated (make bench-targets), so a scenario's name,
// flags and report path are spelled once, in its Spec, and a test fails
// when the file is not what the list generates.

const listSummary = "the scenarios' make targets and the flags they pass (-make: tests/load/bench.mk as generated)"

// benchMK is the Makefile fragment's path from the repository's root.
const benchMK = "tests/load/bench.mk"

// runList parses the list command's flags and prints the list.
func runList(args []string) error {
	fs := flag.NewFlagSet("sluice-bench list", flag.ContinueOnError)
	mk := fs.Bool("make", false, "print the Makefile fragment ("+benchMK+") instead")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	if *mk {
		_, err := io.WriteString(os.Stdout, makefile(specs))
		return err
	}
	return writeList(os.Stdout, specs)
}

// writeList writes a line a make target: its scenario and the flags make
// passes after -temporal.
func writeList(w io.Writer, specs []scenario.Spec) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "make target\tscenario\tflags after -temporal\tin make bench")
	for _, s := range specs {
		for _, t := range s.Targets {
			fmt.Fprintf(tw, "bench-%s\t%s\t%s\t%s\n", t.Name, s.Name, strings.Join(t.Flags(), " "), yesNo(!t.Alone))
		}
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// makefile is tests/load/bench.mk: BENCH_TARGETS (what make bench runs,
// in order), BENCH_ALONE (what runs only on its own) and a rule a target,
// under a comment saying what it runs.
func makefile(specs []scenario.Spec) string {
	var b strings.Builder
	b.WriteString("# The benchmark scenarios' make targets, generated from sluice-bench's\n" +
		"# scenario list by `make bench-targets` (tests/load/cmd/sluice-bench/list.go):\n" +
		"# edit the scenarios' Specs, not this file; go test\n" +
		"# ./tests/load/cmd/sluice-bench/ fails when it is not what they generate.\n\n")
	var inBench, alone []string
	for _, s := range specs {
		for _, t := range s.Targets {
			if t.Alone {
				alone = append(alone, "bench-"+t.Name)
			} else {
				inBench = append(inBench, "bench-"+t.Name)
			}
		}
	}
	fmt.Fprintf(&b, "# make bench runs these, in this order, after bench-go.\nBENCH_TARGETS := %s\n", strings.Join(inBench, " "))
	fmt.Fprintf(&b, "# These run only on their own.\nBENCH_ALONE := %s\n\n.PHONY: $(BENCH_TARGETS) $(BENCH_ALONE)\n", strings.Join(alone, " "))
	for _, s := range specs {
		for _, t := range s.Targets {
			b.WriteString("\n" + comment(targetNote(s, t)))
			fmt.Fprintf(&b, "bench-%s: need $(TEMPORAL) build\n\t%s\n", t.Name, t.Command(s.Name))
		}
	}
	return b.String()
}

// targetNote is what the Makefile says of a target: the scenario's
// summary, the target's notes, and the report it writes.
func targetNote(s scenario.Spec, t scenario.Target) string {
	note := "sluice-bench " + s.Name + ": " + s.Summary + "."
	if t.Notes != "" {
		note += " " + t.Notes
	}
	if t.Report != "" {
		note += " Writes " + t.Report + "."
	}
	return note
}

// comment wraps text into Makefile comment lines of at most 76
// characters.
func comment(text string) string {
	var b strings.Builder
	line := "#"
	for _, word := range strings.Fields(text) {
		if len(line)+1+len(word) > 76 && line != "#" {
			b.WriteString(line + "\n")
			line = "#"
		}
		line += " " + word
	}
	return b.String() + line + "\n"
}
