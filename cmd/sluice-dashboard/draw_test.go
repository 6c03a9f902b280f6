package main

import (
	"image/png"
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
// three panels a row.
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
	if w, h := img.Bounds().Dx(), img.Bounds().Dy(); w != 7*72*columns || h < 4*72*rows {
		t.Fatalf("preview is %dx%d px for %d rows of %d panels", w, h, rows, columns)
	}
}
