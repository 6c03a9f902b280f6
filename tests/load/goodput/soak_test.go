package goodput

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/figure/figuretest"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
)

func TestTrendOfFitsTheLineInTheWindow(t *testing.T) {
	// 2 MiB a minute from minute 10 on, flat 100 before; one unread sample.
	var at, ys []float64
	for s := 0.0; s <= 1200; s += 10 {
		at = append(at, s)
		y := 100.0
		if s >= 600 {
			y = 100 + 2*(s-600)/60
		}
		ys = append(ys, y)
	}
	ys[70] = -1
	w := trendOf(at, ys, 600, 1200)
	if math.Abs(w.slopePerMin-2) > 1e-9 || math.Abs(w.growth-20) > 1e-9 {
		t.Fatalf("slope %.4f/min, growth %.4f; want 2/min and 20", w.slopePerMin, w.growth)
	}
	if w.n != 60 || w.lo != 100 || w.hi != 120 {
		t.Fatalf("n=%d lo=%g hi=%g; want 60 samples from 100 to 120 (the unread one left out)", w.n, w.lo, w.hi)
	}
	if flat := trendOf(at, ys, 0, 590); flat.slopePerMin != 0 || flat.growth != 0 {
		t.Fatalf("flat part: %+v", flat)
	}
}

// soakOf is a scenario judged on the last 10 of 15 minutes, with the
// chart's 512 MiB limits, and samples every 10 s whose API RSS follows
// apiRSS (minutes → MiB) and whose other figures are flat.
func soakOf(apiRSS func(min float64) float64) (*soakScenario, []soakSample) {
	s := &soakScenario{soakOptions: soakOptions{judge: 10 * time.Minute}, loadEnd: 900,
		limits: map[string]float64{procAPI: 512, procWorker: 512}}
	var samples []soakSample
	for sec := 0.0; sec <= 930; sec += 10 {
		samples = append(samples, soakSample{at: sec, procs: map[string]procSample{
			procAPI:      {rssMiB: apiRSS(sec / 60), heapMiB: 20, goroutines: 300 + float64(int(sec)%7), cache: 50},
			procWorker:   {rssMiB: 70, heapMiB: 15, goroutines: 60, cache: 3},
			procRedis:    {rssMiB: 15, heapMiB: -1, goroutines: -1, cache: -1},
			procTemporal: {rssMiB: 200 + float64(int(sec)%3), heapMiB: -1, goroutines: -1, cache: -1},
		}})
	}
	return s, samples
}

func verdicts(s *soakScenario, samples []soakSample) map[string]bool {
	r := &report.Report{}
	s.goals(r, samples, s.loadEnd-s.judge.Seconds(), s.loadEnd)
	out := map[string]bool{}
	for _, g := range r.Goals {
		out[g.What] = g.Met
	}
	return out
}

func TestSoakGoalsPassAPlateauAndCatchGrowth(t *testing.T) {
	// Grows for 4 minutes, then holds: flat over the judged window.
	s, samples := soakOf(func(m float64) float64 { return 65 + 20*min(m, 4) })
	for what, met := range verdicts(s, samples) {
		if !met {
			t.Errorf("plateau: %s missed", what)
		}
	}
	// The leak: about 58 MiB a minute. It is not flat, and it
	// passes the chart's limit.
	s, samples = soakOf(func(m float64) float64 { return 65 + 58*m })
	v := verdicts(s, samples)
	if v["api memory flat over the last 10m0s"] || v["api peak RSS"] {
		t.Errorf("a linear leak passed: %v", v)
	}
	if !v["worker memory flat over the last 10m0s"] || !v["temporal memory flat over the last 10m0s"] {
		t.Errorf("flat processes missed beside the leak: %v", v)
	}
	// A slow leak well under the limit is still not flat: 2 MiB a minute
	// is 20 MiB over the window, within 5% of 512 MiB (25.6); 3 is not.
	s, samples = soakOf(func(m float64) float64 { return 100 + 3*m })
	if verdicts(s, samples)["api memory flat over the last 10m0s"] {
		t.Error("3 MiB/min over 10 minutes passed as flat")
	}
}

func TestParseMetricsTakesEachFamilysLargestSeries(t *testing.T) {
	page := `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 321
go_memstats_heap_inuse_bytes 2.097152e+07
temporal_sticky_cache_size{namespace="default",task_queue="sluice-chat",worker_type="WorkflowWorker"} 12
temporal_sticky_cache_size{namespace="default",task_queue="sluice-chat",label="a b}"} 40
`
	m, err := parseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if valueOf(m, "go_goroutines") != 321 || mibOf(m, "go_memstats_heap_inuse_bytes") != 20 || valueOf(m, "temporal_sticky_cache_size") != 40 {
		t.Fatalf("parsed %v", m)
	}
	if valueOf(m, "absent") != -1 {
		t.Fatal("an absent family is not -1")
	}
}

func TestChartMemoryLimits(t *testing.T) {
	limits, err := chartMemoryLimits(filepath.Join("..", "..", "..", "deploy", "helm", "sluice", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, proc := range []string{procAPI, procWorker} {
		if limits[proc] < 64 {
			t.Errorf("%s limit %.0f MiB", proc, limits[proc])
		}
	}
	for q, want := range map[string]float64{"512Mi": 512, "1Gi": 1024, "1024Ki": 1, "1G": 1e9 / (1 << 20)} {
		if got, err := quantityMiB(q); err != nil || got != want {
			t.Errorf("quantityMiB(%q) = %g, %v; want %g", q, got, err, want)
		}
	}
	for _, q := range []string{"512", "Mi", "-1Mi", "lots"} {
		if _, err := quantityMiB(q); err == nil {
			t.Errorf("quantityMiB(%q) accepted", q)
		}
	}
}

func TestSoakCSVPlots(t *testing.T) {
	_, samples := soakOf(func(m float64) float64 { return 65 + 20*min(m, 4) })
	in := figuretest.WriteFixture(t, "soak.csv", string(soakCSV(samples)))
	if !strings.Contains(string(soakCSV(samples)), "0,redis,15.0,,,\n") {
		t.Fatalf("unread figures are not empty cells:\n%s", soakCSV(samples)[:300])
	}
	out := filepath.Join(t.TempDir(), "soak.png")
	if err := plotSoakCSV(in, out, nil); err != nil {
		t.Fatal(err)
	}
	if b := figuretest.DecodePNG(t, out).Bounds(); b.Dx() < 1000 || b.Dy() < 700 {
		t.Fatalf("figure is %v", b)
	}
}
