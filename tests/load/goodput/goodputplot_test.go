package main

import (
	"image/color"
	"path/filepath"
	"testing"
)

// goodputFixture is goodput.csv's first columns for two loads of each
// loop, both systems; the open loop's last bare step answered nothing.
const goodputFixture = `loop,multiple,system,offered,arrivals_per_s,window_s,goodput_per_s,ttft_p50_ms,ttft_p99_ms,done
closed,1,sluice,16.000,,20,24.600,137.3,293.0,492
closed,1,bare,16.000,,20,25.400,97.0,251.0,508
closed,2,sluice,32.000,,20,25.000,716.5,908.0,500
closed,2,bare,32.000,,20,26.300,795.8,830.0,526
open,1,sluice,24.600,24.300,20,23.600,201.9,770.5,472
open,1,bare,24.600,24.300,20,23.900,167.0,541.9,478
open,2,sluice,49.200,46.850,20,24.250,7413.1,12257.6,485
open,2,bare,49.200,46.850,20,0.000,0.0,0.0,0
`

func TestRenderGoodputPlot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "goodput.png")
	if err := plotGoodputCSV(writeFixture(t, "goodput.csv", goodputFixture), out); err != nil {
		t.Fatal(err)
	}
	// 16 × 10.4 inches at 96 dpi: a row a loop.
	checkPNG(t, out, 1536, 998, map[string]color.Color{"Sluice": systemStyle[sysSluice].color, "the bare workflow": systemStyle[sysBare].color})
}
