package fairness

import (
	"fmt"

	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/vtc"
)

// The fairness report: per workload, the simulator's sizing, Sluice and
// FCFS of this run beside the paper's numbers, what became of the
// requests (vtc.WriteRun), and the goals of issue 25 (vtc.WriteGoals).

func (s *fairnessScenario) Report(r *report.Report) error {
	r.Header(s.headerText())
	sh := reportSheet{r}
	for _, run := range s.runs {
		vtc.WriteRun(sh, run, s.Options, s.cfg)
	}
	vtc.WriteGoals(sh, s.runs, s.Options)
	if s.requestsCSV != "" {
		return s.writeRequests(s.requestsCSV)
	}
	return nil
}

func (s *fairnessScenario) headerText() string {
	return fmt.Sprintf("the VTC paper's workloads (%s) replayed at their arrival times %g× faster than recorded, each row one streamed "+
		"OpenAI chat completion with a prompt of its recorded length and max_tokens %s, each client a tenant of its own at equal weight; "+
		"first straight to the simulator (its FIFO of sequences: FCFS), then through Sluice's POST /v1/chat/completions (gateway mode), "+
		"on one simulator per workload; %g trace seconds replayed, open streams cut %g s after; every time in trace seconds",
		s.workloads, s.Speed, s.maxTokensText(), s.Duration, s.Drain)
}

func (s *fairnessScenario) maxTokensText() string {
	switch s.MaxTokensMode {
	case vtc.MaxTokens1024:
		return "1024 (the simulator still answers each with its recorded length: the answer-length directive)"
	case vtc.MaxTokensOmitted:
		return fmt.Sprintf("omitted (Sluice's api.default_max_tokens and the simulator's default budget raised to %d, above the longest recorded answer, so that neither cuts one short; "+
			"the simulator answers each with its recorded length: the answer-length directive)", vtc.OmittedBudget)
	}
	return "= the recorded output length"
}

// reportSheet writes vtc's sections into a sluice-bench report.
type reportSheet struct{ r *report.Report }

func (sh reportSheet) Linef(format string, args ...any) { sh.r.Linef(format, args...) }
func (sh reportSheet) Table(columns ...string)          { sh.r.Table(columns...) }
func (sh reportSheet) Row(cells ...string)              { sh.r.Row(cells...) }
func (sh reportSheet) Goal(what, measured, want string, met bool) {
	sh.r.Goal(what, measured, want, met)
}
