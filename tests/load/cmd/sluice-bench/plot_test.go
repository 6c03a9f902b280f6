package main

import (
	"image"
	"image/color"
	"image/png"
	"os"
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

// writeFixture writes content to name in a fresh directory.
func writeFixture(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// decodePNG reads a PNG the plot wrote.
func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", path, err)
	}
	return img
}

// pixelsOf counts the pixels of exactly colour c: a series drawn in c
// leaves hundreds; an empty panel none.
func pixelsOf(img image.Image, c color.Color) int {
	r0, g0, b0, _ := c.RGBA()
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r == r0 && g == g0 && bl == b0 {
				n++
			}
		}
	}
	return n
}

// checkPNG checks the figure's size and that each of colours was drawn.
func checkPNG(t *testing.T, path string, w, h int, colours map[string]color.Color) {
	t.Helper()
	img := decodePNG(t, path)
	if got := img.Bounds().Size(); got.X != w || got.Y != h {
		t.Errorf("%s is %dx%d, want %dx%d", filepath.Base(path), got.X, got.Y, w, h)
	}
	for what, c := range colours {
		if n := pixelsOf(img, c); n < 200 {
			t.Errorf("%s: %d pixels of %s, want a drawn series (>= 200)", filepath.Base(path), n, what)
		}
	}
}

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

func TestRenderGoodputPlot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "goodput.png")
	if err := plotGoodputCSV(writeFixture(t, "goodput.csv", goodputFixture), out); err != nil {
		t.Fatal(err)
	}
	// 16 × 10.4 inches at 96 dpi: a row a loop.
	checkPNG(t, out, 1536, 998, map[string]color.Color{"Sluice": systemStyle[sysSluice].color, "the bare workflow": systemStyle[sysBare].color})
}

// TestPlotCommandTellsTheFigureByTheHeader draws each fixture through
// the plot command's path, the PNG beside the CSV by default.
func TestPlotCommandTellsTheFigureByTheHeader(t *testing.T) {
	for name, content := range map[string]string{"heal.csv": healFixture, "goodput.csv": goodputFixture} {
		in := writeFixture(t, name, content)
		if err := runPlot([]string{"-in", in}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		decodePNG(t, strings.TrimSuffix(in, ".csv")+".png")
	}
}

// TestRenderCommittedReports redraws the reports' CSVs, as
// `sluice-bench plot` does for tests/load/report.
func TestRenderCommittedReports(t *testing.T) {
	csvs, err := filepath.Glob(filepath.Join("..", "..", "report", "*.csv"))
	if err != nil || len(csvs) == 0 {
		t.Fatalf("no report CSVs: %v", err)
	}
	for _, in := range csvs {
		out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(in), ".csv")+".png")
		if err := plotCSV(in, out, healDefaultMinSamples); err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		decodePNG(t, out)
	}
}

// TestPlotRefusesWhatItCannotDraw: a CSV without data, of unknown
// columns or with a broken cell is an error naming the problem, and no
// picture is written.
func TestPlotRefusesWhatItCannotDraw(t *testing.T) {
	healHeader, _, _ := strings.Cut(healFixture, "\n")
	goodputHeader, _, _ := strings.Cut(goodputFixture, "\n")
	for _, tc := range []struct {
		name, content, want string
	}{
		{"empty file", "", "empty"},
		{"heal.csv without rows", healHeader + "\n", "no data rows"},
		{"goodput.csv without rows", goodputHeader + "\n", "no data rows"},
		{"unknown columns", "a,b\n1,2\n", "none of heal.csv's columns"},
		{"short pool never has enough latencies", healHeader + "\noff,3.0,short,2,25.8,28.5,1.11,0,0\n", "no sample of the short pool of 30 latencies"},
		{"a cell that is not a number", healHeader + "\noff,3.0,short,forty,25.8,28.5,1.11,0,0\n", "line 2, column count"},
		{"a load of zero", goodputHeader + "\nclosed,0,sluice,0,,20,1,1,1,1\n", "is not positive"},
	} {
		dir := t.TempDir()
		out := filepath.Join(dir, "plot.png")
		err := plotCSV(writeFixture(t, "in.csv", tc.content), out, 30)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
		}
		if _, serr := os.Stat(out); serr == nil {
			t.Errorf("%s: a picture was written", tc.name)
		}
	}
}
