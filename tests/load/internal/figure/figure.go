// Package figure draws the reports' figures: gonum/plot panels in a
// grid, each row's legend in a column to the right of the row, where it
// never covers a curve. A figure is always drawn from its CSV, whether a
// scenario has just written it or `sluice-bench plot` redraws an old
// one, so the picture and the numbers beside it cannot disagree.
package figure

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// figureDPI makes an inch of the figure this many pixels.
const figureDPI = 96

// legendGap is the space between the panels and the legends' column,
// which the last tick label of an x axis may reach into.
const legendGap = vg.Inch / 2

// sansFont reads better than gonum's default serif at screen sizes.
var sansFont = font.Font{Typeface: "Liberation", Variant: "Sans"}

// Figure is panels in rows (every row as many), a legend per row, and
// the size of one row.
type Figure struct {
	Rows      [][]*plot.Plot
	Legends   []plot.Legend
	Width     vg.Length
	RowHeight vg.Length
}

// WritePNG draws the figure into a PNG at path.
func (f Figure) WritePNG(path string) error {
	if len(f.Rows) == 0 || len(f.Legends) != len(f.Rows) {
		return fmt.Errorf("figure %s: %d rows, %d legends", path, len(f.Rows), len(f.Legends))
	}
	img := vgimg.NewWith(vgimg.UseWH(f.Width, f.RowHeight*vg.Length(len(f.Rows))), vgimg.UseDPI(figureDPI))
	dc := draw.New(img)
	// The legends' column is as wide as the widest legend.
	var legendWidth vg.Length
	for _, l := range f.Legends {
		legendWidth = max(legendWidth, l.Rectangle(dc).Size().X)
	}
	panels := draw.Crop(dc, 0, -(legendWidth + legendGap + vg.Inch/8), 0, 0)
	tiles := draw.Tiles{
		Rows: len(f.Rows), Cols: len(f.Rows[0]),
		PadX: vg.Inch / 2, PadY: vg.Inch / 3, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8,
	}
	canvases := plot.Align(f.Rows, tiles, panels)
	for i, row := range f.Rows {
		for j, p := range row {
			p.Draw(canvases[i][j])
		}
		// The legend starts level with the top of the row's data.
		data := row[len(row)-1].DataCanvas(canvases[i][len(row)-1])
		at := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{
			Min: vg.Point{X: panels.Max.X + legendGap, Y: data.Min.Y},
			Max: vg.Point{X: dc.Max.X, Y: data.Max.Y},
		}}
		l := f.Legends[i]
		l.Top, l.Left = true, true
		l.Draw(at)
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create figure: %w", err)
	}
	defer out.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		return fmt.Errorf("write figure %s: %w", path, err)
	}
	return out.Close()
}

// DrawBeside draws a report's figure with draw. A figure that cannot be
// drawn (a run too short for a sample worth plotting) is told on stderr,
// and no older run's figure is left beside the new numbers: the report
// stands without it, and its verdicts are still printed.
func DrawBeside(scenario, png string, draw func() error) {
	if err := draw(); err != nil {
		_ = os.Remove(png)
		fmt.Fprintf(os.Stderr, "sluice-bench %s: %s not drawn: %v\n", scenario, filepath.Base(png), err)
	}
}

// NewPanel is a plot with the figures' type and a grid.
func NewPanel(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, xLabel, yLabel
	p.Title.TextStyle.Font = font.From(sansFont, 14)
	p.Title.Padding = vg.Points(8)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sansFont, 12)
		a.Tick.Label.Font = font.From(sansFont, 11)
	}
	p.Add(plotter.NewGrid())
	return p
}

// NewLegend is a legend in the figures' type.
func NewLegend() plot.Legend {
	l := plot.NewLegend()
	l.TextStyle.Font = font.From(sansFont, 12)
	l.ThumbnailWidth = vg.Points(30)
	l.Padding = vg.Points(5)
	return l
}

// SeriesStyle is how one series is drawn.
type SeriesStyle struct {
	Color  color.Color
	Dashes []vg.Length
	// Glyph marks each point; nil draws the line alone.
	Glyph draw.GlyphDrawer
	// Step draws the line as a staircase (a level held until the next
	// point).
	Step bool
}

// AddSeries draws xys on p in st and names it in the legend (once,
// under name; an empty name adds no entry). Each element of segments is
// drawn as its own line, so that a gap in the data stays a gap.
func AddSeries(p *plot.Plot, l *plot.Legend, name string, st SeriesStyle, segments ...plotter.XYs) error {
	var thumbs []plot.Thumbnailer
	for _, xys := range segments {
		if len(xys) == 0 {
			continue
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		line.Color, line.Width, line.Dashes = st.Color, vg.Points(2), st.Dashes
		if st.Step {
			line.StepStyle = plotter.PostStep
		}
		p.Add(line)
		thumbs = []plot.Thumbnailer{line}
		if st.Glyph != nil {
			dots, err := plotter.NewScatter(xys)
			if err != nil {
				return fmt.Errorf("plot %s: %w", name, err)
			}
			dots.Color, dots.Shape, dots.Radius = st.Color, st.Glyph, vg.Points(3.5)
			p.Add(dots)
			thumbs = append(thumbs, dots)
		}
	}
	if name != "" && thumbs != nil {
		l.Add(name, thumbs...)
	}
	return nil
}

// AddGuide draws a dashed horizontal line at y across [x0, x1], under
// whatever is added after it, and returns it for the legend.
func AddGuide(p *plot.Plot, y, x0, x1 float64, c color.Color) (*plotter.Line, error) {
	line, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return nil, fmt.Errorf("guide at %g: %w", y, err)
	}
	line.Color, line.Width, line.Dashes = c, vg.Points(2), []vg.Length{vg.Points(6), vg.Points(4)}
	p.Add(line)
	return line, nil
}

// LogRange sets a log10-valued axis to run from the 1-2-5 mark below lo
// to the one above hi (lo and hi being quantities, not logarithms), so
// that both ends are labelled; a point within 10% of a mark gets the
// next one, to keep off the panel's edge.
func LogRange(a *plot.Axis, lo, hi float64) {
	if lo <= 0 || hi < lo {
		return
	}
	lo, hi = lo/1.1, hi*1.1
	down, up := lo, hi
	for _, t := range ticks125(lo/10, lo) {
		down = t.Value
	}
	if ts := ticks125(hi, hi*10); len(ts) > 0 {
		up = ts[0].Value
	}
	a.Min, a.Max = math.Log10(down)-0.02, math.Log10(up)+0.02
}

// Log10Axis marks an axis whose values are log10 of the quantity with
// the quantity itself, at 1, 2 and 5 times each power of ten. The values
// are plotted as logarithms on a linear axis because gonum centres a
// vertical axis's label on the arithmetic mean of a log scale's range,
// which sits near the top and squeezes the panel.
var Log10Axis = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
	ts := ticks125(math.Pow(10, lo), math.Pow(10, hi))
	for i := range ts {
		ts[i].Value = math.Log10(ts[i].Value)
	}
	return ts
})

// TicksLinear marks a linear axis about five times, at a round step (1,
// 2 or 5 times a power of ten), labelled without trailing zeros.
func TicksLinear(lo, hi float64) []plot.Tick {
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
// ten, labelled: an axis spanning a decade or two, marked at powers of
// ten alone, would be nearly unlabelled.
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

// Table is a CSV file's data rows, read by column name.
type Table struct {
	Path string
	col  map[string]int
	Rows [][]string
}

// ReadCSV reads a CSV file with a header, which must name every column
// of required; a file without data rows is an error, not an empty plot.
func ReadCSV(path string, required ...string) (*Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read csv: %w", err)
	}
	defer f.Close()
	all, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("%s: empty, not even a header", path)
	}
	t := &Table{Path: path, col: map[string]int{}, Rows: all[1:]}
	for i, name := range all[0] {
		t.col[name] = i
	}
	for _, name := range required {
		if _, ok := t.col[name]; !ok {
			return nil, fmt.Errorf("%s: no column %q", path, name)
		}
	}
	if len(t.Rows) == 0 {
		return nil, fmt.Errorf("%s: no data rows to plot", path)
	}
	return t, nil
}

// Has says whether the header names every one of columns.
func (t *Table) Has(columns ...string) bool {
	for _, c := range columns {
		if _, ok := t.col[c]; !ok {
			return false
		}
	}
	return true
}

// Str is row i's cell of column name.
func (t *Table) Str(i int, name string) string { return t.Rows[i][t.col[name]] }

// Num is row i's cell of column name as a number; an empty cell is an
// error, as is one that is not a number.
func (t *Table) Num(i int, name string) (float64, error) {
	v, err := strconv.ParseFloat(t.Str(i, name), 64)
	if err != nil {
		// Line 1 is the header.
		return 0, fmt.Errorf("%s line %d, column %s: %w", t.Path, i+2, name, err)
	}
	return v, nil
}
