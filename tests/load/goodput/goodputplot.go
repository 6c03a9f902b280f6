package goodput

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/sluice-dev/sluice/tests/load/internal/figure"
)

// goodput.png, from goodput.csv: a row a loop (closed, then open),
// goodput and TTFT p99 side by side, a line a system. The load axes are
// logarithmic (the loads double from step to step), as is TTFT p99 (a
// queue takes it from tens of milliseconds to tens of seconds).

var systemStyle = map[string]struct {
	name  string
	color color.RGBA
	shape draw.GlyphDrawer
}{
	sysSluice: {"Sluice", color.RGBA{30, 90, 220, 255}, draw.CircleGlyph{}},
	sysBare:   {"bare workflow (no admission)", color.RGBA{110, 110, 110, 255}, draw.SquareGlyph{}},
}

// goodputPoint is a row of goodput.csv: one system under one load.
type goodputPoint struct {
	loop, system string
	// mult is the load as a multiple of P clients (closed loop) or of
	// the capacity (open loop); offered is the clients or arrivals/s.
	mult, offered float64
	goodput       float64 // answers done/s
	ttftP99       float64 // ms; 0 when nothing was answered
}

// goodputColumns are the columns of goodput.csv the plot reads.
var goodputColumns = []string{"loop", "multiple", "system", "offered", "goodput_per_s", "ttft_p99_ms"}

// readGoodputCSV reads goodput.csv.
func readGoodputCSV(path string) ([]goodputPoint, error) {
	t, err := figure.ReadCSV(path, goodputColumns...)
	if err != nil {
		return nil, err
	}
	return goodputPoints(t)
}

func goodputPoints(t *figure.Table) ([]goodputPoint, error) {
	pts := make([]goodputPoint, len(t.Rows))
	for i := range t.Rows {
		var nums [4]float64
		for k, col := range []string{"multiple", "offered", "goodput_per_s", "ttft_p99_ms"} {
			v, err := t.Num(i, col)
			if err != nil {
				return nil, err
			}
			nums[k] = v
		}
		pts[i] = goodputPoint{loop: t.Str(i, "loop"), system: t.Str(i, "system"), mult: nums[0], offered: nums[1], goodput: nums[2], ttftP99: nums[3]}
		if pts[i].offered <= 0 || pts[i].mult <= 0 {
			return nil, fmt.Errorf("%s line %d: load %g (%g×) is not positive", t.Path, i+2, pts[i].offered, pts[i].mult)
		}
	}
	return pts, nil
}

// plotGoodputCSV draws goodput.csv into a PNG at out.
func plotGoodputCSV(in, out string) error {
	pts, err := readGoodputCSV(in)
	if err != nil {
		return err
	}
	f, err := goodputFigure(pts)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	return f.WritePNG(out)
}

// goodputFigure is a row a loop that has points.
func goodputFigure(pts []goodputPoint) (figure.Figure, error) {
	f := figure.Figure{Width: 16 * vg.Inch, RowHeight: 5.2 * vg.Inch}
	for _, loop := range []string{loopClosed, loopOpen} {
		var steps []goodputPoint
		for _, p := range pts {
			if p.loop == loop {
				steps = append(steps, p)
			}
		}
		if len(steps) == 0 {
			continue
		}
		gp, tp, l, err := loopPlots(loop, steps)
		if err != nil {
			return f, err
		}
		f.Rows = append(f.Rows, []*plot.Plot{gp, tp})
		f.Legends = append(f.Legends, l)
	}
	if len(f.Rows) == 0 {
		return f, fmt.Errorf("no row of loop %s or %s", loopClosed, loopOpen)
	}
	return f, nil
}

// loopPlots are one loop's two panels, goodput and TTFT p99, and their
// legend.
func loopPlots(loop string, steps []goodputPoint) (goodput, ttft *plot.Plot, l plot.Legend, err error) {
	// The loads are multiples of one: P clients, or the capacity the
	// closed loop measured.
	unit := steps[0].offered / steps[0].mult
	xLabel := "concurrent clients (log scale)"
	title := fmt.Sprintf("Closed loop, P = %.0f permits", unit)
	if loop == loopOpen {
		xLabel = "offered load, Poisson arrivals (requests/s, log scale)"
		title = fmt.Sprintf("Open loop, 1× = %.1f requests/s", unit)
	}
	goodput = figure.NewPanel(title+": goodput", xLabel, "goodput (answers done/s)")
	ttft = figure.NewPanel(title+": TTFT p99", xLabel, "TTFT p99 of answers done (ms, log scale)")
	l = figure.NewLegend()
	goodput.Y.Min, goodput.Y.Tick.Marker = 0, plot.TickerFunc(figure.TicksLinear)
	ttft.Y.Tick.Marker = figure.Log10Axis
	var ticks plot.ConstantTicks
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range steps {
		if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == s.offered }) {
			ticks = append(ticks, plot.Tick{Value: s.offered, Label: fmt.Sprintf("%.3g (%g×)", s.offered, s.mult)})
		}
		lo, hi = min(lo, s.offered), max(hi, s.offered)
	}
	for _, p := range []*plot.Plot{goodput, ttft} {
		// Set, not taken from the data: a panel without points would
		// otherwise get a range through 0, which a log scale cannot show.
		p.X.Min, p.X.Max = lo, hi
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, ticks
	}
	answered := false
	for _, sys := range goodputSystems(steps) {
		var gxy, txy plotter.XYs
		for _, s := range steps {
			if s.system != sys {
				continue
			}
			gxy = append(gxy, plotter.XY{X: s.offered, Y: s.goodput})
			// A log axis has no zero: a step without answers has no point.
			if s.ttftP99 > 0 {
				txy = append(txy, plotter.XY{X: s.offered, Y: math.Log10(s.ttftP99)})
				answered = true
			}
		}
		st := systemStyle[sys]
		if st.name == "" {
			st.name, st.color, st.shape = sys, color.RGBA{200, 120, 0, 255}, draw.TriangleGlyph{}
		}
		style := figure.SeriesStyle{Color: st.color, Glyph: st.shape}
		if err := figure.AddSeries(goodput, &l, st.name, style, gxy); err != nil {
			return nil, nil, l, err
		}
		if err := figure.AddSeries(ttft, nil, "", style, txy); err != nil {
			return nil, nil, l, err
		}
	}
	goodput.Y.Max = max(goodput.Y.Max*1.1, 1)
	if answered {
		figure.LogRange(&ttft.Y, math.Pow(10, ttft.Y.Min), math.Pow(10, ttft.Y.Max))
	} else {
		ttft.Title.Text += " (nothing answered)"
		ttft.Y.Min, ttft.Y.Max = 0, 4
	}
	return goodput, ttft, l, nil
}

// goodputSystems are the systems among steps, in their order.
func goodputSystems(steps []goodputPoint) []string {
	var out []string
	for _, s := range steps {
		if !slices.Contains(out, s.system) {
			out = append(out, s.system)
		}
	}
	return out
}
