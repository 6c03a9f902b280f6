package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// columns is how many panels a row of the preview holds: two, so that
// at a README's width (about 800 px, half the image) the text is still
// read. Grafana's own widths are not kept.
const columns = 2

// A tile is one panel: its plot, and its legend on its right, outside the
// data.
const (
	tileW, tileH = 11 * vg.Inch, 5.2 * vg.Inch
	legendW      = 3.7 * vg.Inch
	headerH      = 0.8 * vg.Inch
	// legendChars cuts a long legend entry (an endpoint's URL).
	legendChars = 24
)

var (
	sans = font.Font{Typeface: "Liberation", Variant: "Sans"}
	// palette is one colour per series of a panel: Tableau's 10 and two
	// more; a panel with more series than colours draws the rest dashed.
	palette = []color.Color{
		color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
		color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
		color.RGBA{0xe3, 0x77, 0xc2, 0xff}, color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, color.RGBA{0xbc, 0xbd, 0x22, 0xff},
		color.RGBA{0x17, 0xbe, 0xcf, 0xff}, color.RGBA{0x00, 0x00, 0x00, 0xff}, color.RGBA{0xff, 0xbb, 0x00, 0xff},
	}
	// Annotations and thresholds are drawn in colours no series has.
	markColor      = color.NRGBA{0x99, 0x99, 0x99, 0xa0}
	thresholdColor = color.RGBA{0xc0, 0x00, 0x40, 0xff}
)

// drawPNG lays the panels out in a grid and writes the PNG.
func drawPNG(d dashboardData, r previewRange, out string) error {
	rows := (len(d.panels) + columns - 1) / columns
	img := vgimg.NewWith(vgimg.UseWH(tileW*columns, tileH*vg.Length(rows)+headerH), vgimg.UseDPI(72))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	title := fmt.Sprintf("Sluice dashboard: its queries on a real Prometheus, %s to %s (not a Grafana screenshot)",
		r.start.Format("2006-01-02 15:04:05"), r.end.Format("15:04:05 MST"))
	dc.FillText(draw.TextStyle{Color: color.Black, Font: font.From(sans, 28), XAlign: draw.XCenter, YAlign: draw.YCenter,
		Handler: plot.DefaultTextHandler}, vg.Point{X: dc.Max.X / 2, Y: dc.Max.Y - headerH/2}, title)
	body := draw.Crop(dc, 0, 0, 0, -headerH)
	tiles := draw.Tiles{Rows: rows, Cols: columns, PadX: vg.Points(24), PadY: vg.Points(20),
		PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(8)}
	span := r.end.Sub(r.start).Seconds()
	for i, pd := range d.panels {
		p, legend, err := panelPlot(pd, d.marks, span)
		if err != nil {
			return err
		}
		c := tiles.At(body, i%columns, i/columns)
		p.Draw(draw.Crop(c, 0, -legendW, 0, 0))
		legend.Draw(draw.Crop(c, c.Max.X-c.Min.X-legendW+vg.Points(12), 0, 0, -vg.Points(40)))
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", out, err)
	}
	return f.Close()
}

// panelPlot draws one panel: its series, its thresholds dashed, and the
// annotations as thin vertical lines; and its legend, which drawPNG puts
// beside the plot rather than over the data.
func panelPlot(pd panelData, marks []mark, span float64) (*plot.Plot, plot.Legend, error) {
	p := plot.New()
	legend := plot.NewLegend()
	p.Title.Text = pd.row + " · " + pd.panel.Title
	p.Title.TextStyle.Font = font.From(sans, 24)
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "minutes"
	p.Y.Label.Text = pd.panel.Axis
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, 20)
		a.Tick.Label.Font = font.From(sans, 18)
	}
	p.Y.Tick.Marker = plot.TickerFunc(compactTicks)
	p.X.Min, p.X.Max = 0, span/60
	p.Y.Min = 0
	legend.TextStyle.Font = font.From(sans, 18)
	legend.Top, legend.Left = true, true
	legend.ThumbnailWidth = vg.Points(30)
	p.Add(plotter.NewGrid())
	ymax := 0.0
	for i, s := range pd.lines {
		xys := make(plotter.XYs, len(s.points))
		for k, pt := range s.points {
			xys[k] = plotter.XY{X: pt[0] / 60, Y: pt[1]}
			ymax = max(ymax, pt[1])
		}
		if len(xys) == 0 {
			continue
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return nil, legend, fmt.Errorf("panel %q, %s: %w", pd.panel.Title, s.name, err)
		}
		line.Color, line.Width = palette[i%len(palette)], vg.Points(2.5)
		if i >= len(palette) {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(line)
		legend.Add(shorten(s.name), line)
	}
	if len(pd.lines) == 0 {
		p.Title.Text += " (no data)"
	}
	thresholdShown := false
	for _, t := range pd.panel.Thresholds {
		if t > ymax*1.5 && ymax > 0 {
			continue // far above the data: it would flatten the lines
		}
		ymax = max(ymax, t)
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: t}, {X: span / 60, Y: t}})
		if err != nil {
			return nil, legend, err
		}
		l.Color, l.Width, l.Dashes = thresholdColor, vg.Points(1.5), []vg.Length{vg.Points(8), vg.Points(5)}
		p.Add(l)
		if !thresholdShown {
			legend.Add("threshold", l)
			thresholdShown = true
		}
	}
	if ymax == 0 {
		ymax = 1
	}
	p.Y.Max = ymax * 1.25
	markShown := false
	for _, m := range marks {
		l, err := plotter.NewLine(plotter.XYs{{X: m.at / 60, Y: 0}, {X: m.at / 60, Y: p.Y.Max}})
		if err != nil {
			return nil, legend, err
		}
		l.Color, l.Width, l.Dashes = markColor, vg.Points(1.5), []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(l)
		if !markShown {
			legend.Add("healer action or alert", l)
			markShown = true
		}
	}
	return p, legend, nil
}

// shorten cuts a legend entry to legendChars, keeping its end (where an
// endpoint's port and path are).
func shorten(name string) string {
	r := []rune(name)
	if len(r) <= legendChars {
		return name
	}
	return "…" + string(r[len(r)-legendChars+1:])
}

// compactTicks are gonum's default ticks labelled without trailing zeros
// and with k or M for thousands and millions (2500.00 → 2.5k).
func compactTicks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i, t := range ticks {
		if t.Label == "" {
			continue
		}
		ticks[i].Label = compact(t.Value)
	}
	return ticks
}

func compact(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
