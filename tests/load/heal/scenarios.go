// Package heal holds the heal scenario: the 80/20 mixed load on one
// simulator with the healer off, then on, and the short pool's tail over
// time in both.
package heal

import "github.com/sluice-dev/sluice/tests/load/internal/scenario"

// Heal is the scenario of this package: the healer under the 80/20 mixed
// load, off then on.
var Heal = scenario.Spec{
	Name:    "heal",
	Summary: "80% short / 20% long on one simulator, healing off then on: short P99/P50 over time",
	New:     func() scenario.Scenario { return &healScenario{} },
	Targets: []scenario.Target{{Name: "heal",
		Notes: "About 4 minutes; writes tests/load/report/heal.{md,csv,png}."}},
	Figure: &scenario.Figure{CSV: "heal.csv", Columns: healColumns,
		Draw: func(in, out string, opts scenario.PlotOptions) error { return plotHealCSV(in, out, opts.MinSamples) }},
}
