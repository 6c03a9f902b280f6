package scenario

import "strings"

// A Spec is one scenario as sluice-bench and make know it. Each scenario
// family's package declares a Spec per scenario; sluice-bench's list of
// them is the one place the scenarios are named: its usage, its
// dispatch, `sluice-bench plot` and the Makefile's bench targets
// (tests/load/bench.mk) all come from it.
type Spec struct {
	// Name is the subcommand: sluice-bench <Name>.
	Name string
	// Summary is the scenario's line in the usage.
	Summary string
	// New returns a fresh scenario to bind the flags to.
	New func() Scenario
	// Targets are the make targets that run the scenario, in make
	// bench's order.
	Targets []Target
	// Figure is the PNG its report draws from a CSV; nil when it draws
	// none.
	Figure *Figure
}

// A Target is a make target that runs a scenario, make bench-<Name>:
//
//	$(BIN)/sluice-bench <scenario> -temporal $(TEMPORAL) <Args> $(<FlagsVar>) -report <Report>
//
// with the parts that are not set left out.
type Target struct {
	// Name follows bench- in the target's name: the scenario's, or
	// another for a second setting of it (fairness-1024).
	Name string
	// Args are the flags make passes after -temporal.
	Args []string
	// FlagsVar names a make variable whose value make adds after Args,
	// for flags given on make's command line (FAIRNESS_FLAGS).
	FlagsVar string
	// Report is the report -report writes, from the repository's root;
	// "" for a scenario that writes its own files under -out (heal,
	// goodput and soak write a CSV and a plot beside the report).
	Report string
	// Alone keeps the target out of make bench: it is run on its own.
	Alone bool
	// Notes are what the Makefile says above the target besides the
	// scenario's summary and its report: how long it takes, what it
	// needs, what it writes itself.
	Notes string
}

// Flags are the flags make passes the scenario after -temporal, make
// variables as make writes them.
func (t Target) Flags() []string {
	flags := append([]string(nil), t.Args...)
	if t.FlagsVar != "" {
		flags = append(flags, "$("+t.FlagsVar+")")
	}
	if t.Report != "" {
		flags = append(flags, "-report", t.Report)
	}
	return flags
}

// Command is the target's recipe for scenario.
func (t Target) Command(scenario string) string {
	return strings.Join(append([]string{"$(BIN)/sluice-bench", scenario, "-temporal", "$(TEMPORAL)"}, t.Flags()...), " ")
}

// A Figure is the PNG a scenario's report draws from its CSV. `sluice-bench
// plot` redraws one from the CSV alone, telling whose it is by the
// CSV's header.
type Figure struct {
	// CSV is the CSV's file name (heal.csv), for messages.
	CSV string
	// Columns are the header's columns that make a CSV this figure's.
	Columns []string
	// Draw draws the CSV at in into a PNG at out.
	Draw func(in, out string, opts PlotOptions) error
}

// PlotOptions are the flags of `sluice-bench plot` a figure may read.
type PlotOptions struct {
	// MinSamples leaves out the heal figure's samples of fewer
	// latencies (the run's healing.min_samples).
	MinSamples int64
}
