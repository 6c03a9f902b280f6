package goodput

import (
	"image/color"
	"path/filepath"
	"testing"

	"github.com/sluice-dev/sluice/tests/load/internal/figure/figuretest"
)

// goodputFixture is goodput.csv's first columns for two loads of each
// loop, both systems (testdata/goodput.csv); the open loop's last bare
// step answered nothing.
const goodputFixture = "testdata/goodput.csv"

func TestRenderGoodputPlot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "goodput.png")
	if err := plotGoodputCSV(goodputFixture, out); err != nil {
		t.Fatal(err)
	}
	// 16 × 10.4 inches at 96 dpi: a row a loop.
	figuretest.CheckPNG(t, out, 1536, 998, map[string]color.Color{"Sluice": systemStyle[sysSluice].color, "the bare workflow": systemStyle[sysBare].color})
}
