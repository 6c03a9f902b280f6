package vtc

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
)

// sheet keeps what a report section wrote.
type sheet struct{ lines, goals []string }

func (s *sheet) Linef(format string, args ...any) {
	s.lines = append(s.lines, fmt.Sprintf(format, args...))
}
func (s *sheet) Table(...string) {}
func (s *sheet) Row(...string)   {}
func (s *sheet) Goal(what, measured, want string, met bool) {
	s.goals = append(s.goals, GoalLine(what, measured, want, met))
}

// The goals set a run beside the paper's VTC row that knew what Sluice
// knew: the known-length row when max_tokens is the recorded length,
// else the unknown-length row, with the known-length row as the aim.
func TestGoalsMatchWhatSluiceKnew(t *testing.T) {
	result := func(max, avg, tput float64) *System {
		return &System{Result: Result{MaxDiff: max, AvgDiff: avg, Throughput: tput}}
	}
	for _, c := range []struct {
		mode string
		want []string
	}{
		{MaxTokensRecorded, []string{"Max Diff, Sluice / FCFS (goal: the paper's " + VTCKnown + ", 329.5 / 760.0): 45.0 / 100.0 = 0.45× (goal <= 0.43×) — MISSED",
			"Avg Diff, Sluice / FCFS (goal: the paper's " + VTCKnown + ", 227.5 / 433.5): 50.0 / 100.0 = 0.50× (goal <= 0.52×) — met"}},
		{MaxTokens1024, []string{"Max Diff, Sluice / FCFS (goal: the paper's " + VTCUnknown + ", 368.4 / 760.0): 45.0 / 100.0 = 0.45× (goal <= 0.48×) — met",
			"Max Diff, Sluice / FCFS (aim: the paper's " + VTCKnown + ", 329.5 / 760.0): 45.0 / 100.0 = 0.45× (goal <= 0.43×) — MISSED"}},
		{MaxTokensOmitted, []string{"Avg Diff, Sluice / FCFS (goal: the paper's " + VTCUnknown + ", 251.7 / 433.5): 50.0 / 100.0 = 0.50× (goal <= 0.58×) — met"}},
	} {
		run := &Run{Workload: Workloads["real"], Systems: []*System{result(100, 100, 1000), result(45, 50, 990)}}
		run.Systems[0].Name, run.Systems[1].Name = FCFS, Sluice
		o := DefaultOptions()
		o.MaxTokensMode = c.mode
		var sh sheet
		WriteGoals(&sh, []*Run{run}, o)
		all := strings.Join(sh.goals, "\n")
		for _, w := range c.want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: no goal line %q in\n%s", c.mode, w, all)
			}
		}
		if want := 3 + 2*btoi(c.mode != MaxTokensRecorded); len(sh.goals) != want {
			t.Errorf("%s: %d goal lines, want %d:\n%s", c.mode, len(sh.goals), want, all)
		}
	}
	// Overload too is held to FCFS's throughput, once whatever the rows.
	run := &Run{Workload: Workloads["overload"], Systems: []*System{result(100, 100, 1000), result(45, 50, 919)}}
	run.Systems[0].Name, run.Systems[1].Name = FCFS, Sluice
	o := DefaultOptions()
	o.MaxTokensMode = MaxTokens1024
	var sh sheet
	WriteGoals(&sh, []*Run{run}, o)
	want := "overload: throughput, Sluice / FCFS: 919 / 1000 = 0.919× (goal >= 0.95×) — MISSED"
	if n := strings.Count(strings.Join(sh.goals, "\n"), want); n != 1 {
		t.Errorf("%d goal lines %q in\n%s", n, want, strings.Join(sh.goals, "\n"))
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Omitting max_tokens, a row's body names none, and Sluice's default
// budget is raised above the longest recorded answer.
func TestOmittedMaxTokens(t *testing.T) {
	var body map[string]any
	if err := json.Unmarshal(ChatBody("m", "hi", 0), &body); err != nil {
		t.Fatal(err)
	}
	if _, ok := body["max_tokens"]; ok {
		t.Errorf("a body without a bound names max_tokens: %v", body)
	}
	o := DefaultOptions()
	o.MaxTokensMode = MaxTokensOmitted
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Pools.Short.Endpoints, cfg.Pools.Long.Endpoints = []string{"http://127.0.0.1:1"}, []string{"http://127.0.0.1:1"}
	(&Run{Keys: map[string]config.APIKey{}}).Configure(&cfg, o)
	if cfg.API.DefaultMaxTokens < 977 {
		t.Errorf("api.default_max_tokens %d cuts the longest recorded answer (977)", cfg.API.DefaultMaxTokens)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}
