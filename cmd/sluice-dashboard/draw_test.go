package main

import (
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/sluice-dev/sluice/deploy/grafana"
)

func TestLegend(t *testing.T) {
	m := model.Metric{"pool": "short", "kind": "prompt"}
	if got := legend("{{pool}} {{kind}}", m); got != "short prompt" {
		t.Fatalf("legend = %q", got)
	}
}

// Every dashboard panel is drawn, with or without data, into a PNG of
// two panels a row.
func TestDrawEveryPanel(t *testing.T) {
	var d dashboardData
	for _, row := range grafana.Rows {
		for i, p := range row.Panels {
			pd := panelData{row: row.Title, panel: p}
			if i%2 == 0 {
				pd.lines = []series{{name: "a", points: [][2]float64{{0, 1}, {60, 3}, {120, 2}}}}
			}
			d.panels = append(d.panels, pd)
		}
	}
	d.marks = []mark{{at: 90, title: "set_permits short"}}
	start := time.Unix(0, 0)
	out := filepath.Join(t.TempDir(), "preview.png")
	if err := drawPNG(d, previewRange{start: start, end: start.Add(3 * time.Minute), step: 5 * time.Second}, out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	rows := (len(d.panels) + columns - 1) / columns
	if w, h := img.Bounds().Dx(), img.Bounds().Dy(); w != int(tileW.Points())*columns || h < int(tileH.Points())*rows {
		t.Fatalf("preview is %dx%d px for %d rows of %d panels", w, h, rows, columns)
	}
}

func TestCompactTicks(t *testing.T) {
	for v, want := range map[float64]string{2500: "2.5k", 0.25: "0.25", 12: "12", 3e6: "3M", 0: "0"} {
		if got := compact(v); got != want {
			t.Errorf("compact(%v) = %q, want %q", v, got, want)
		}
	}
	if got := shorten("long http://127.0.0.1:33225/v1 and more"); len([]rune(got)) != legendChars || got[:3] != "…" {
		t.Errorf("shorten = %q", got)
	}
}

// SLUICE_PREVIEW_OUT=/tmp/x.png go test -run TestDrawSample draws a
// sample with many series, to look at.
func TestDrawSample(t *testing.T) {
	out := os.Getenv("SLUICE_PREVIEW_OUT")
	if out == "" {
		t.Skip("SLUICE_PREVIEW_OUT not set")
	}
	var d dashboardData
	for _, row := range grafana.Rows[:2] {
		for _, p := range row.Panels {
			pd := panelData{row: row.Title, panel: p}
			for k := range 7 {
				s := series{name: fmt.Sprintf("series %d of a long name http://127.0.0.1:3322%d/v1", k, k)}
				for x := 0; x <= 240; x += 5 {
					s.points = append(s.points, [2]float64{float64(x), float64(k*300) + 200*math.Sin(float64(x)/30+float64(k))})
				}
				pd.lines = append(pd.lines, s)
			}
			d.panels = append(d.panels, pd)
		}
	}
	d.marks = []mark{{at: 90, title: "set_permits short"}}
	start := time.Unix(0, 0)
	if err := drawPNG(d, previewRange{start: start, end: start.Add(4 * time.Minute), step: 5 * time.Second}, out); err != nil {
		t.Fatal(err)
	}
}
