package main

import (
	"image/color"
	"path/filepath"
	"strings"
	"testing"
)

// healFixture is heal.csv's header and a few samples of both modes: the
// short pool's first sample has too few latencies to be plotted.
const healFixture = `mode,t_s,pool,count,p50_ms,p99_ms,ratio,level,polls
off,3.0,short,2,25.8,28.5,1.11,0,0
off,3.0,long,0,0.0,0.0,0.00,0,0
off,6.0,short,40,38.5,634.9,16.49,0,0
off,6.0,long,4,200.0,400.0,2.00,0,0
off,9.0,short,42,52.0,1279.3,24.60,0,0
off,9.0,long,5,210.0,420.0,2.00,0,0
on,3.0,short,2,23.4,23.4,1.00,0,2
on,3.0,long,0,0.0,0.0,0.00,0,2
on,6.0,short,40,42.6,634.9,14.90,1,5
on,6.0,long,4,200.0,400.0,2.00,0,5
on,9.0,short,43,38.5,57.5,1.49,2,8
on,9.0,long,5,210.0,420.0,2.00,1,8
`

func TestRenderHealPlot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "heal.png")
	if err := plotHealCSV(writeFixture(t, "heal.csv", healFixture), out, 30); err != nil {
		t.Fatal(err)
	}
	// 13 × 11.1 inches at 96 dpi: three panels, the levels' included.
	checkPNG(t, out, 1248, 1066, map[string]color.Color{"healing off": colHealOff, "healing on": colHealOn, "the long pool's level": colLongPool})
}

func TestRenderHealPlotWithoutHealingOnHasNoLevelPanel(t *testing.T) {
	var off []string
	for _, l := range strings.SplitAfter(healFixture, "\n") {
		if !strings.HasPrefix(l, "on,") {
			off = append(off, l)
		}
	}
	out := filepath.Join(t.TempDir(), "heal.png")
	if err := plotHealCSV(writeFixture(t, "heal.csv", strings.Join(off, "")), out, 30); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, out, 1248, 710, map[string]color.Color{"healing off": colHealOff})
}
