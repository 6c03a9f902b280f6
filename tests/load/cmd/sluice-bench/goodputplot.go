package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// goodput.png: a row a loop (closed, open), goodput and TTFT p99 side by
// side, a line a system. The load axes are logarithmic (the loads double
// from step to step), as is TTFT p99 (a queue takes it from tens of
// milliseconds to tens of seconds).

var systemStyle = map[string]struct {
	name  string
	color color.RGBA
	shape draw.GlyphDrawer
}{
	sysSluice: {"Sluice", color.RGBA{30, 90, 220, 255}, draw.CircleGlyph{}},
	sysBare:   {"bare workflow (no admission)", color.RGBA{110, 110, 110, 255}, draw.SquareGlyph{}},
}

// plotGoodput draws the curves into a PNG at path.
func plotGoodput(g *goodputScenario, path string) error {
	var rows [][]*plot.Plot
	for _, loop := range []string{loopClosed, loopOpen} {
		steps := g.stepsOf(loop)
		if len(steps) == 0 {
			continue
		}
		gp, tp, err := g.loopPlots(loop, steps)
		if err != nil {
			return err
		}
		rows = append(rows, []*plot.Plot{gp, tp})
	}
	if len(rows) == 0 {
		return nil
	}
	const w, h = 13 * vg.Inch, 6 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h*vg.Length(len(rows))), vgimg.UseDPI(96))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: 2, PadX: vg.Inch / 2, PadY: vg.Inch / 2, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 4}
	for i := range rows {
		for j := range rows[i] {
			rows[i][j].Draw(tiles.At(dc, j, i))
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create plot: %w", err)
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return f.Close()
}

func (g *goodputScenario) stepsOf(loop string) []*goodputStep {
	var out []*goodputStep
	for _, s := range g.steps {
		if s.loop == loop {
			out = append(out, s)
		}
	}
	return out
}

// loopPlots are one loop's two panels: goodput and TTFT p99.
func (g *goodputScenario) loopPlots(loop string, steps []*goodputStep) (goodput, ttft *plot.Plot, err error) {
	xLabel := "concurrent clients (log scale)"
	title := fmt.Sprintf("Closed loop, P = %d permits, %d-token answers", g.permits, g.maxTokens)
	if loop == loopOpen {
		xLabel = "offered load, Poisson arrivals/s (log scale)"
		title = fmt.Sprintf("Open loop, 1× = %.1f/s", g.measured)
	}
	goodput, ttft = plot.New(), plot.New()
	goodput.Title.Text, ttft.Title.Text = title+": goodput", title+": TTFT p99"
	goodput.Y.Label.Text, ttft.Y.Label.Text = "goodput (answers done/s)", "TTFT p99 of answers done (ms, log scale)"
	goodput.Y.Min, goodput.Y.Tick.Marker = 0, plot.TickerFunc(ticksLinear)
	// TTFT is plotted as log10(ms) on a linear axis marked in ms: gonum
	// centres a vertical axis's label on the arithmetic mean of its range,
	// which on a log scale sits near the top and squeezes the panel.
	ttft.Y.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		ts := ticks125(math.Pow(10, lo), math.Pow(10, hi))
		for i := range ts {
			ts[i].Value = math.Log10(ts[i].Value)
		}
		return ts
	})
	var ticks plot.ConstantTicks
	for _, s := range steps {
		if s.system == g.systemList[0] {
			ticks = append(ticks, plot.Tick{Value: s.offered(), Label: fmt.Sprintf("%.3g (%g×)", s.offered(), s.mult)})
		}
	}
	for _, p := range []*plot.Plot{goodput, ttft} {
		p.X.Label.Text = xLabel
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, ticks
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
	}
	for _, sys := range g.systemList {
		var gxy, txy plotter.XYs
		for _, s := range steps {
			if s.system != sys {
				continue
			}
			gxy = append(gxy, plotter.XY{X: s.offered(), Y: s.goodput()})
			// A log axis has no zero: a step without answers has no point.
			if p99 := s.ttft().at(99); p99 > 0 {
				txy = append(txy, plotter.XY{X: s.offered(), Y: math.Log10(msf(p99))})
			}
		}
		if err := addSeries(goodput, sys, gxy); err != nil {
			return nil, nil, err
		}
		if err := addSeries(ttft, sys, txy); err != nil {
			return nil, nil, err
		}
	}
	// Headroom above the highest point keeps the legend off the curves.
	goodput.Y.Max *= 1.3
	ttft.Y.Min, ttft.Y.Max = ttft.Y.Min-math.Log10(1.5), ttft.Y.Max+math.Log10(4)
	return goodput, ttft, nil
}

// ticksLinear marks a linear axis about five times, at a round step (1,
// 2 or 5 times a power of ten), labelled without trailing zeros.
func ticksLinear(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	if hi <= lo {
		return ts
	}
	base := math.Pow(10, math.Floor(math.Log10((hi-lo)/5)))
	step := base
	for _, m := range []float64{1, 2, 5, 10} {
		if step = m * base; (hi-lo)/step <= 6 {
			break
		}
	}
	for k := math.Ceil(lo / step); k*step <= hi; k++ {
		v, _ := strconv.ParseFloat(strconv.FormatFloat(k*step, 'g', 6, 64), 64)
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ts
}

// ticks125 marks a logarithmic axis at 1, 2 and 5 times each power of
// ten, labelled: a TTFT axis spans only a decade or two, where marks at
// powers of ten alone would leave it nearly unlabelled.
func ticks125(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	if lo <= 0 || hi <= lo {
		return ts
	}
	for p := math.Pow(10, math.Floor(math.Log10(lo))); p <= hi; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := m * p; v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
			}
		}
	}
	return ts
}

// addSeries adds a system's line and points, and its legend entry.
func addSeries(p *plot.Plot, system string, xys plotter.XYs) error {
	if len(xys) == 0 {
		return nil
	}
	st := systemStyle[system]
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("plot %s: %w", system, err)
	}
	l.Color, l.Width = st.color, vg.Points(2)
	s.Color, s.Shape, s.Radius = st.color, st.shape, vg.Points(4)
	p.Add(l, s)
	p.Legend.Add(st.name, l, s)
	return nil
}
