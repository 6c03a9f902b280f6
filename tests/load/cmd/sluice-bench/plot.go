package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/sluice-dev/sluice/tests/load/heal"
	"github.com/sluice-dev/sluice/tests/load/internal/figure"
	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
)

// `sluice-bench plot` redraws a report's figure from its CSV, without
// running the scenario again: after a change to the figure, or for a CSV
// of an earlier run (git show <commit>:tests/load/report/goodput.csv).

// figures are the scenarios' figures, in the order of specs.
func figures() []*scenario.Figure {
	var out []*scenario.Figure
	for _, s := range specs {
		if s.Figure != nil {
			out = append(out, s.Figure)
		}
	}
	return out
}

// plotSummary is the plot command's line in the usage.
func plotSummary() string {
	var csvs []string
	for _, f := range figures() {
		csvs = append(csvs, f.CSV)
	}
	return "redraw a report's PNG from its CSV (" + strings.Join(csvs, ", ") + "), without running anything"
}

// runPlot parses the plot command's flags and draws the figure.
func runPlot(args []string) error {
	fs := flag.NewFlagSet("sluice-bench plot", flag.ContinueOnError)
	in := fs.String("in", "", "the CSV a scenario wrote (heal.csv or goodput.csv, or a copy of one); its header says which figure to draw")
	out := fs.String("out", "", "the PNG to write (default: -in with .png for .csv)")
	minSamples := fs.Int64("min-samples", heal.DefaultMinSamples, "heal: leave out samples of fewer latencies (the run's healing.min_samples)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: sluice-bench plot -in tests/load/report/heal.csv [-out heal.png]\n\n%s\n\nflags:\n", plotSummary())
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
	if err := plotCSV(*in, *out, scenario.PlotOptions{MinSamples: *minSamples}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "sluice-bench plot: wrote %s\n", *out)
	return nil
}

// plotCSV draws the figure of the CSV at in, told by its header, into
// out.
func plotCSV(in, out string, opts scenario.PlotOptions) error {
	t, err := figure.ReadCSV(in)
	if err != nil {
		return err
	}
	figs := figures()
	for _, f := range figs {
		if t.Has(f.Columns...) {
			return f.Draw(in, out, opts)
		}
	}
	var known []string
	for i, f := range figs {
		whose := f.CSV + "'s"
		if i == 0 {
			whose += " columns"
		}
		known = append(known, whose+" ("+strings.Join(f.Columns, ",")+")")
	}
	last := len(known) - 1
	return fmt.Errorf("%s: none of %s or %s", in, strings.Join(known[:last], ", "), known[last])
}
