package heal

import (
	"image/color"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/tests/load/internal/figure/figuretest"
)

// healFixture is heal.csv's header and a few samples of both modes
// (testdata/heal.csv): the short pool's first sample has too few
// latencies to be plotted.
const healFixture = "testdata/heal.csv"

func TestRenderHealPlot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "heal.png")
	if err := plotHealCSV(healFixture, out, 30); err != nil {
		t.Fatal(err)
	}
	// 13 × 11.1 inches at 96 dpi: three panels, the levels' included.
	figuretest.CheckPNG(t, out, 1248, 1066, map[string]color.Color{"healing off": colHealOff, "healing on": colHealOn, "the long pool's level": colLongPool})
}

func TestRenderHealPlotWithoutHealingOnHasNoLevelPanel(t *testing.T) {
	var off []string
	for _, l := range strings.SplitAfter(figuretest.Read(t, healFixture), "\n") {
		if !strings.HasPrefix(l, "on,") {
			off = append(off, l)
		}
	}
	out := filepath.Join(t.TempDir(), "heal.png")
	if err := plotHealCSV(figuretest.WriteFixture(t, "heal.csv", strings.Join(off, "")), out, 30); err != nil {
		t.Fatal(err)
	}
	figuretest.CheckPNG(t, out, 1248, 710, map[string]color.Color{"healing off": colHealOff})
}
