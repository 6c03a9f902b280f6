package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// `sluice-bench plot` redraws a report's figure from its CSV, without
// running the scenario again: after a change to the figure, or for a CSV
// kept from an earlier run (goodput-before.csv).

const plotSummary = "redraw a report's PNG from its CSV (heal.csv, goodput.csv, soak.csv), without running anything"

// runPlot parses the plot command's flags and draws the figure.
func runPlot(args []string) error {
	fs := flag.NewFlagSet("sluice-bench plot", flag.ContinueOnError)
	in := fs.String("in", "", "the CSV a scenario wrote (heal.csv or goodput.csv, or a copy of one); its header says which figure to draw")
	out := fs.String("out", "", "the PNG to write (default: -in with .png for .csv)")
	minSamples := fs.Int64("min-samples", healDefaultMinSamples, "heal: leave out samples of fewer latencies (the run's healing.min_samples)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: sluice-bench plot -in tests/load/report/heal.csv [-out heal.png]\n\n%s\n\nflags:\n", plotSummary)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("plot: -in is required, and takes no other arguments")
	}
	if *out == "" {
		*out = strings.TrimSuffix(*in, ".csv") + ".png"
	}
	if err := plotCSV(*in, *out, *minSamples); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "sluice-bench plot: wrote %s\n", *out)
	return nil
}

// plotCSV draws the figure of the CSV at in, told by its header, into
// out.
func plotCSV(in, out string, minSamples int64) error {
	t, err := readCSV(in)
	if err != nil {
		return err
	}
	switch {
	case t.has(healColumns...):
		return plotHealCSV(in, out, minSamples)
	case t.has(goodputColumns...):
		return plotGoodputCSV(in, out)
	case t.has(soakColumns...):
		// The limits drawn are the chart's as it is now.
		limits, _ := chartMemoryLimits("deploy/helm/sluice/values.yaml")
		return plotSoakCSV(in, out, limits)
	}
	return fmt.Errorf("%s: none of heal.csv's columns (%s), goodput.csv's (%s) or soak.csv's (%s)", in,
		strings.Join(healColumns, ","), strings.Join(goodputColumns, ","), strings.Join(soakColumns, ","))
}
