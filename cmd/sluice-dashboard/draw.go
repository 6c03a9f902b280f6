package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// columns is how many panels a row of the preview holds; Grafana's own
// widths are not kept, so that every panel is large enough to read.
const columns = 3

var (
	sans    = font.Font{Typeface: "Liberation", Variant: "Sans"}
	palette = []color.Color{
		color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
		color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
		color.RGBA{0xe3, 0x77, 0xc2, 0xff}, color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, color.RGBA{0xbc, 0xbd, 0x22, 0xff},
		color.RGBA{0x17, 0xbe, 0xcf, 0xff},
	}
	markColor      = color.NRGBA{0xff, 0x8c, 0x00, 0xc0}
	thresholdColor = color.RGBA{0xd6, 0x27, 0x28, 0xff}
)

// drawPNG lays the panels out in a grid and writes the PNG.
func drawPNG(d dashboardData, r previewRange, out string) error {
	rows := (len(d.panels) + columns - 1) / columns
	const w, h = 7 * vg.Inch, 4.2 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w*columns, h*vg.Length(rows)+0.6*vg.Inch), vgimg.UseDPI(72))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	title := fmt.Sprintf("Sluice dashboard: its queries on a real Prometheus, %s to %s (not a Grafana screenshot)",
		r.start.Format("2006-01-02 15:04:05"), r.end.Format("15:04:05 MST"))
	dc.FillText(draw.TextStyle{Color: color.Black, Font: font.From(sans, 20), XAlign: draw.XCenter, Handler: plot.DefaultTextHandler},
		vg.Point{X: dc.Max.X / 2, Y: dc.Max.Y - 0.4*vg.Inch}, title)
	body := draw.Crop(dc, 0, 0, 0, -0.6*vg.Inch)
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, columns)
	}
	span := r.end.Sub(r.start).Seconds()
	for i, pd := range d.panels {
		p, err := panelPlot(pd, d.marks, span)
		if err != nil {
			return err
		}
		grid[i/columns][i%columns] = p
	}
	tiles := draw.Tiles{Rows: rows, Cols: columns, PadX: vg.Points(14), PadY: vg.Points(14),
		PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(14)}
	canvases := plot.Align(grid, tiles, body)
	for i := range grid {
		for j, p := range grid[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
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
// annotations as thin vertical lines.
func panelPlot(pd panelData, marks []mark, span float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pd.row + " · " + pd.panel.Title
	p.Title.TextStyle.Font = font.From(sans, 15)
	p.X.Label.Text = "minutes"
	p.Y.Label.Text = unitLabel(pd.panel.Unit)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, 12)
		a.Tick.Label.Font = font.From(sans, 11)
	}
	p.X.Min, p.X.Max = 0, span/60
	p.Y.Min = 0
	p.Legend.TextStyle.Font = font.From(sans, 11)
	p.Legend.Top = true
	p.Legend.ThumbnailWidth = vg.Points(18)
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
			return nil, fmt.Errorf("panel %q, %s: %w", pd.panel.Title, s.name, err)
		}
		line.Color, line.Width = palette[i%len(palette)], vg.Points(1.5)
		p.Add(line)
		if i < 8 {
			p.Legend.Add(s.name, line)
		}
	}
	if len(pd.lines) == 0 {
		p.Title.Text += " (no data)"
	}
	for _, t := range pd.panel.Thresholds {
		if t > ymax*1.5 && ymax > 0 {
			continue // far above the data: it would flatten the lines
		}
		ymax = max(ymax, t)
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: t}, {X: span / 60, Y: t}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Width, l.Dashes = thresholdColor, vg.Points(1), []vg.Length{vg.Points(5), vg.Points(3)}
		p.Add(l)
	}
	if ymax == 0 {
		ymax = 1
	}
	p.Y.Max = ymax * 1.25
	for _, m := range marks {
		l, err := plotter.NewLine(plotter.XYs{{X: m.at / 60, Y: 0}, {X: m.at / 60, Y: p.Y.Max}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = markColor, vg.Points(0.8)
		p.Add(l)
	}
	return p, nil
}

func unitLabel(unit string) string {
	switch unit {
	case "s":
		return "seconds"
	case "reqps":
		return "requests/s"
	case "percentunit":
		return "ratio"
	case "Bps":
		return "bytes/s"
	}
	return ""
}
