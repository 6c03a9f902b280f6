package heal

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/figure"
	"github.com/sluice-dev/sluice/workflows"
)

// heal.png, from heal.csv: three panels over the same time axis. The
// short pool's P99/P50 in each mode against the healer's thresholds; its
// P50 and P99 themselves, so that a ratio falling because P50 rose is
// told from one falling because P99 did; and, with healing on, each
// pool's healing level, whose steps are the healer's actions.

// healPoint is a row of heal.csv: one pool in one sample of one mode.
type healPoint struct {
	mode, pool string
	// t is seconds since the load started.
	t float64
	// count is how many latencies the sample's P50 and P99 are of.
	count    int64
	p50, p99 float64 // ms
	ratio    float64
	level    int
}

// healColumns are the columns of heal.csv the plot reads.
var healColumns = []string{"mode", "t_s", "pool", "count", "p50_ms", "p99_ms", "ratio", "level"}

// readHealCSV reads heal.csv.
func readHealCSV(path string) ([]healPoint, error) {
	t, err := figure.ReadCSV(path, healColumns...)
	if err != nil {
		return nil, err
	}
	return healPoints(t)
}

func healPoints(t *figure.Table) ([]healPoint, error) {
	pts := make([]healPoint, len(t.Rows))
	for i := range t.Rows {
		var nums [6]float64
		for k, col := range []string{"t_s", "count", "p50_ms", "p99_ms", "ratio", "level"} {
			v, err := t.Num(i, col)
			if err != nil {
				return nil, err
			}
			nums[k] = v
		}
		pts[i] = healPoint{mode: t.Str(i, "mode"), pool: t.Str(i, "pool"), t: nums[0], count: int64(nums[1]),
			p50: nums[2], p99: nums[3], ratio: nums[4], level: int(nums[5])}
	}
	return pts, nil
}

// plotHealCSV draws heal.csv into a PNG at out. Samples of the short
// pool of fewer than minSamples latencies are left out of the latency
// panels: their P99 is one of a handful, and their ratio noise.
func plotHealCSV(in, out string, minSamples int64) error {
	pts, err := readHealCSV(in)
	if err != nil {
		return err
	}
	f, err := healFigure(pts, minSamples)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	return f.WritePNG(out)
}

var (
	colHealOff  = color.RGBA{110, 110, 110, 255}
	colHealOn   = color.RGBA{30, 90, 220, 255}
	colWarn     = color.RGBA{230, 150, 0, 255}
	colCritical = color.RGBA{210, 40, 40, 255}
	colLongPool = color.RGBA{150, 60, 170, 255}
	dashed      = []vg.Length{vg.Points(5), vg.Points(3)}
)

// healModeStyle is a mode's colour and glyph, healing off first.
func healModeStyle(mode string) (color.Color, draw.GlyphDrawer) {
	if mode == "on" {
		return colHealOn, draw.CircleGlyph{}
	}
	return colHealOff, draw.SquareGlyph{}
}

// healThresholds are the healer's thresholds on the P99/P50 ratio, which
// the heal scenario leaves at their defaults: above critical it steps a
// level up; below warn the pool counts as healthy, and enough healthy
// polls in a row step it back.
func healThresholds() (warn, critical float64) {
	h := config.Default().Healing
	return h.WarnRatio, h.CriticalRatio
}

// healFigure lays out the panels: the levels only when a mode ran with
// healing on.
func healFigure(pts []healPoint, minSamples int64) (figure.Figure, error) {
	if !hasHealSeries(pts, minSamples) {
		return figure.Figure{}, fmt.Errorf("no sample of the short pool of %d latencies or more", minSamples)
	}
	modes := healModes(pts)
	tMax := 0.0
	for _, p := range pts {
		tMax = max(tMax, p.t)
	}
	f := figure.Figure{Width: 13 * vg.Inch, RowHeight: 3.7 * vg.Inch}
	ratio, ratioLegend := figure.NewPanel("Short pool: tail of time to first token, P99 / P50",
		"time since the load started (s)", "P99 / P50 (ratio, log scale)"), figure.NewLegend()
	latency, latencyLegend := figure.NewPanel("Short pool: time to first token, P50 and P99",
		"time since the load started (s)", "time to first token (ms, log scale)"), figure.NewLegend()
	warn, critical := healThresholds()
	critLine, err := figure.AddGuide(ratio, math.Log10(critical), 0, tMax, colCritical)
	if err != nil {
		return f, err
	}
	warnLine, err := figure.AddGuide(ratio, math.Log10(warn), 0, tMax, colWarn)
	if err != nil {
		return f, err
	}
	for _, m := range modes {
		if err := addHealLatencies(ratio, &ratioLegend, latency, &latencyLegend, pts, m, minSamples); err != nil {
			return f, err
		}
	}
	ratioLegend.Add(fmt.Sprintf("%g: critical, healer steps up", critical), critLine)
	ratioLegend.Add(fmt.Sprintf("%g: warn, healthy below", warn), warnLine)
	f.Rows = [][]*plot.Plot{{ratio}, {latency}}
	f.Legends = []plot.Legend{ratioLegend, latencyLegend}
	if slices.Contains(modes, "on") {
		levels, levelLegend := figure.NewPanel("Healing level, healing on (each step is a healer action)",
			"time since the load started (s)", "level"), figure.NewLegend()
		if err := addHealLevels(levels, &levelLegend, pts); err != nil {
			return f, err
		}
		f.Rows = append(f.Rows, []*plot.Plot{levels})
		f.Legends = append(f.Legends, levelLegend)
	}
	for _, row := range f.Rows {
		row[0].X.Min, row[0].X.Max = 0, tMax
		row[0].X.Tick.Marker = plot.TickerFunc(figure.TicksLinear)
	}
	ratio.Y.Tick.Marker, latency.Y.Tick.Marker = figure.Log10Axis, figure.Log10Axis
	// A ratio is 1 without a tail, and never below: the axis starts at 1.
	figure.LogRange(&ratio.Y, math.Pow(10, ratio.Y.Min), math.Pow(10, ratio.Y.Max))
	ratio.Y.Min = -0.02
	figure.LogRange(&latency.Y, math.Pow(10, latency.Y.Min), math.Pow(10, latency.Y.Max))
	return f, nil
}

// healModes are the modes in the CSV, in their order.
func healModes(pts []healPoint) []string {
	var modes []string
	for _, p := range pts {
		if !slices.Contains(modes, p.mode) {
			modes = append(modes, p.mode)
		}
	}
	return modes
}

// hasHealSeries says whether any short pool sample is plotted.
func hasHealSeries(pts []healPoint, minSamples int64) bool {
	for _, p := range pts {
		if p.pool == request.PoolShort && p.count >= minSamples && p.p50 > 0 && p.ratio > 0 {
			return true
		}
	}
	return false
}

// addHealLatencies adds a mode's short pool ratio, P50 and P99, in
// segments split where a sample had too few latencies.
func addHealLatencies(ratio *plot.Plot, rl *plot.Legend, latency *plot.Plot, ll *plot.Legend, pts []healPoint, mode string, minSamples int64) error {
	var ratios, p50s, p99s []plotter.XYs
	var cur [3]plotter.XYs
	flush := func() {
		if len(cur[0]) > 0 {
			ratios, p50s, p99s = append(ratios, cur[0]), append(p50s, cur[1]), append(p99s, cur[2])
		}
		cur = [3]plotter.XYs{}
	}
	for _, p := range pts {
		if p.mode != mode || p.pool != request.PoolShort {
			continue
		}
		if p.count < minSamples || p.p50 <= 0 || p.p99 <= 0 || p.ratio <= 0 {
			flush()
			continue
		}
		cur[0] = append(cur[0], plotter.XY{X: p.t, Y: math.Log10(p.ratio)})
		cur[1] = append(cur[1], plotter.XY{X: p.t, Y: math.Log10(p.p50)})
		cur[2] = append(cur[2], plotter.XY{X: p.t, Y: math.Log10(p.p99)})
	}
	flush()
	c, g := healModeStyle(mode)
	name := "healing " + mode
	if err := figure.AddSeries(ratio, rl, name, figure.SeriesStyle{Color: c, Glyph: g}, ratios...); err != nil {
		return err
	}
	if err := figure.AddSeries(latency, ll, "P99, "+name, figure.SeriesStyle{Color: c, Glyph: g}, p99s...); err != nil {
		return err
	}
	return figure.AddSeries(latency, ll, "P50, "+name, figure.SeriesStyle{Color: c, Dashes: dashed}, p50s...)
}

// healLevelNames name the healing levels on the level axis by what
// entering each one does.
var healLevelNames = map[int]string{
	workflows.LevelNormal:   "0 normal",
	workflows.LevelShrink:   "1 fewer permits",
	workflows.LevelThrottle: "2 long pool throttled",
	workflows.LevelScale:    "3 more replicas",
	workflows.LevelShed:     "4 shedding",
}

// addHealLevels adds each pool's level with healing on, as a staircase.
func addHealLevels(p *plot.Plot, l *plot.Legend, pts []healPoint) error {
	for _, pool := range []string{request.PoolShort, request.PoolLong} {
		var xys plotter.XYs
		for _, pt := range pts {
			if pt.mode == "on" && pt.pool == pool {
				xys = append(xys, plotter.XY{X: pt.t, Y: float64(pt.level)})
			}
		}
		st := figure.SeriesStyle{Color: colHealOn, Step: true}
		if pool == request.PoolLong {
			st = figure.SeriesStyle{Color: colLongPool, Step: true, Dashes: dashed}
		}
		if err := figure.AddSeries(p, l, pool+" pool", st, xys); err != nil {
			return err
		}
	}
	var ticks plot.ConstantTicks
	for lvl := workflows.LevelNormal; lvl <= workflows.LevelShed; lvl++ {
		ticks = append(ticks, plot.Tick{Value: float64(lvl), Label: healLevelNames[lvl]})
	}
	p.Y.Tick.Marker = ticks
	p.Y.Min, p.Y.Max = -0.3, float64(workflows.LevelShed)+0.3
	return nil
}
