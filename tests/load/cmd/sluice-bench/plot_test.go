package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/tests/load/heal"
	"github.com/sluice-dev/sluice/tests/load/internal/figure/figuretest"
	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
)

// The figures' test fixtures, kept beside the scenarios that draw them.
const (
	healFixture    = "../../heal/testdata/heal.csv"
	goodputFixture = "../../goodput/testdata/goodput.csv"
)

// TestPlotCommandTellsTheFigureByTheHeader draws each fixture through
// the plot command's path, the PNG beside the CSV by default.
func TestPlotCommandTellsTheFigureByTheHeader(t *testing.T) {
	for name, fixture := range map[string]string{"heal.csv": healFixture, "goodput.csv": goodputFixture} {
		in := figuretest.WriteFixture(t, name, figuretest.Read(t, fixture))
		if err := runPlot([]string{"-in", in}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		figuretest.DecodePNG(t, strings.TrimSuffix(in, ".csv")+".png")
	}
}

// TestRenderCommittedReports redraws the reports' CSVs, as
// `sluice-bench plot` does for tests/load/report.
func TestRenderCommittedReports(t *testing.T) {
	csvs, err := filepath.Glob(filepath.Join("..", "..", "report", "*.csv"))
	if err != nil || len(csvs) == 0 {
		t.Fatalf("no report CSVs: %v", err)
	}
	for _, in := range csvs {
		out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(in), ".csv")+".png")
		if err := plotCSV(in, out, scenario.PlotOptions{MinSamples: heal.DefaultMinSamples}); err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		figuretest.DecodePNG(t, out)
	}
}

// TestPlotRefusesWhatItCannotDraw: a CSV without data, of unknown
// columns or with a broken cell is an error naming the problem, and no
// picture is written.
func TestPlotRefusesWhatItCannotDraw(t *testing.T) {
	healHeader, _, _ := strings.Cut(figuretest.Read(t, healFixture), "\n")
	goodputHeader, _, _ := strings.Cut(figuretest.Read(t, goodputFixture), "\n")
	for _, tc := range []struct {
		name, content, want string
	}{
		{"empty file", "", "empty"},
		{"heal.csv without rows", healHeader + "\n", "no data rows"},
		{"goodput.csv without rows", goodputHeader + "\n", "no data rows"},
		{"unknown columns", "a,b\n1,2\n", "none of heal.csv's columns"},
		{"short pool never has enough latencies", healHeader + "\noff,3.0,short,2,25.8,28.5,1.11,0,0\n", "no sample of the short pool of 30 latencies"},
		{"a cell that is not a number", healHeader + "\noff,3.0,short,forty,25.8,28.5,1.11,0,0\n", "line 2, column count"},
		{"a load of zero", goodputHeader + "\nclosed,0,sluice,0,,20,1,1,1,1\n", "is not positive"},
	} {
		dir := t.TempDir()
		out := filepath.Join(dir, "plot.png")
		err := plotCSV(figuretest.WriteFixture(t, "in.csv", tc.content), out, scenario.PlotOptions{MinSamples: 30})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
		}
		if _, serr := os.Stat(out); serr == nil {
			t.Errorf("%s: a picture was written", tc.name)
		}
	}
}
