// Package goodput holds the scenarios that measure what Sluice serves
// under more load than its permits: a crowd at once (burst), rising
// load, closed and open loop, beside a bare workflow (goodput), and the
// pool's capacity for half an hour (soak).
package goodput

import "github.com/sluice-dev/sluice/tests/load/internal/scenario"

// The scenarios of this package: what Sluice serves under more load than
// its permits, at once (burst), rising (goodput) and for half an hour
// (soak).
var (
	Burst = scenario.Spec{
		Name:    "burst",
		Summary: "2,000 concurrent SSE clients against 20 permits: outcomes, hangs, leaks",
		New:     func() scenario.Scenario { return &burstScenario{} },
		Targets: []scenario.Target{{Name: "burst", Report: "tests/load/report/burst.md"}},
	}
	Goodput = scenario.Spec{
		Name:    "goodput",
		Summary: "goodput and TTFT against offered load, closed and open loop, Sluice vs a bare workflow",
		New:     func() scenario.Scenario { return &goodputScenario{} },
		Targets: []scenario.Target{{Name: "goodput",
			Notes: "About 10 minutes; writes tests/load/report/goodput.{md,csv,png}."}},
		Figure: &scenario.Figure{CSV: "goodput.csv", Columns: goodputColumns,
			Draw: func(in, out string, _ scenario.PlotOptions) error { return plotGoodputCSV(in, out) }},
	}
	Soak = scenario.Spec{
		Name:    "soak",
		Summary: "30 minutes at the pool's capacity: every process's memory, goroutines and workflow cache level off",
		New:     func() scenario.Scenario { return &soakScenario{} },
		Targets: []scenario.Target{{Name: "soak", Alone: true,
			Notes: "make run's shape (the API with its embedded worker, and a worker, as processes of their own) at the short pool's capacity, every process's memory, goroutines and workflow cache sampled; the verdict is on the last 20 minutes. Writes tests/load/report/soak.{md,csv,png}. Not part of make bench: it takes 32 minutes on its own."}},
		Figure: &scenario.Figure{CSV: "soak.csv", Columns: soakColumns, Draw: drawSoakCSV},
	}
)

// drawSoakCSV draws a soak.csv with the memory limits of the Helm chart
// as it is now.
func drawSoakCSV(in, out string, _ scenario.PlotOptions) error {
	limits, _ := chartMemoryLimits("deploy/helm/sluice/values.yaml")
	return plotSoakCSV(in, out, limits)
}
