package goodput

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/sluice-dev/sluice/tests/load/internal/figure"
)

// soak.png, from soak.csv: resident memory of every process beside the Go
// heap of Sluice's own, then their goroutines beside their workflow
// caches, all against minutes into the run, with the chart's memory
// limits as dashed lines.

var soakColors = map[string]color.RGBA{
	procAPI:      {30, 90, 220, 255},
	procWorker:   {220, 110, 20, 255},
	procRedis:    {200, 40, 40, 255},
	procTemporal: {40, 150, 70, 255},
}

// plotSoakCSV draws soak.csv into a PNG at out; limits (MiB by process,
// may be nil) are drawn as guides.
func plotSoakCSV(in, out string, limits map[string]float64) error {
	t, err := figure.ReadCSV(in, soakColumns...)
	if err != nil {
		return err
	}
	cols := []string{"rss_mib", "heap_inuse_mib", "goroutines", "workflow_cache"}
	pts := map[string]map[string]plotter.XYs{}
	var end float64
	for i := range t.Rows {
		at, err := t.Num(i, "elapsed_s")
		if err != nil {
			return err
		}
		end = max(end, at/60)
		proc := t.Str(i, "process")
		if pts[proc] == nil {
			pts[proc] = map[string]plotter.XYs{}
		}
		for _, c := range cols {
			if t.Str(i, c) == "" {
				continue
			}
			v, err := t.Num(i, c)
			if err != nil {
				return err
			}
			pts[proc][c] = append(pts[proc][c], plotter.XY{X: at / 60, Y: v})
		}
	}
	panels := [][]*plot.Plot{
		{figure.NewPanel("Resident memory", "minutes", "MiB"), figure.NewPanel("Go heap in use", "minutes", "MiB")},
		{figure.NewPanel("Goroutines", "minutes", "goroutines"), figure.NewPanel("Workflow cache", "minutes", "workflows")},
	}
	legends := []plot.Legend{figure.NewLegend(), figure.NewLegend()}
	for _, proc := range soakProcesses {
		st := figure.SeriesStyle{Color: soakColors[proc]}
		for row, pair := range [][2]string{{"rss_mib", "heap_inuse_mib"}, {"goroutines", "workflow_cache"}} {
			name := proc
			if len(pts[proc][pair[0]]) == 0 {
				continue
			}
			if err := figure.AddSeries(panels[row][0], &legends[row], name, st, pts[proc][pair[0]]); err != nil {
				return err
			}
			if err := figure.AddSeries(panels[row][1], &legends[row], "", st, pts[proc][pair[1]]); err != nil {
				return err
			}
		}
	}
	for _, proc := range []string{procAPI, procWorker} {
		if l, ok := limits[proc]; ok {
			guide, err := figure.AddGuide(panels[0][0], l, 0, end, soakColors[proc])
			if err != nil {
				return err
			}
			legends[0].Add(fmt.Sprintf("%s chart limit (%.0f MiB)", proc, l), guide)
		}
	}
	for _, row := range panels {
		for _, p := range row {
			p.X.Min, p.Y.Min = 0, 0
		}
	}
	f := figure.Figure{Rows: panels, Legends: legends, Width: 12 * vg.Inch, RowHeight: 4 * vg.Inch}
	if err := f.WritePNG(out); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	return nil
}
