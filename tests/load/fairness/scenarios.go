// Package fairness holds the scenarios that measure what tenants and
// tiers get of a backend they share: token shares on shared pools and
// pools apart (pools), SLO attainment by tier (slo), and the VTC paper's
// workloads replayed (fairness).
package fairness

import "github.com/sluice-dev/sluice/tests/load/internal/scenario"

// The scenarios of this package: what tenants and tiers get of a backend
// they share, by token share (pools, fairness) and by SLO (slo).
var (
	Pools = scenario.Spec{
		Name:    "pools",
		Summary: "two equal tenants, one per pool, on make run's shared pools vs pools apart: token shares, TTFT",
		New:     func() scenario.Scenario { return &poolsScenario{} },
		Targets: []scenario.Target{{Name: "pools", Report: "tests/load/report/pools.md"}},
	}
	SLO = scenario.Spec{
		Name:    "slo",
		Summary: "SLO attainment by tier at 0.5×–2× capacity over 5 seeds: Sluice without and with preemption vs FCFS straight to the simulator, beside the ceiling without preemption",
		New:     func() scenario.Scenario { return &sloScenario{} },
		Targets: []scenario.Target{
			{Name: "slo", FlagsVar: "SLO_FLAGS", Report: "tests/load/report/slo.md",
				Notes: "Every answer 128 tokens. About 40 minutes (4 loads × 5 seeds × 3 modes); SLO_FLAGS adds flags (say -seeds 1 -loads 2 for a smoke run)."},
			{Name: "slo-vtc", Args: []string{"-workload", "vtc"}, FlagsVar: "SLO_FLAGS", Report: "tests/load/report/slo-vtc.md",
				Notes: "Answer lengths drawn from the VTC real trace's (../shared/workloads/vtc-real.csv, beside the checkout; mean 256 tokens). About 45 minutes (4 loads × 5 seeds × 3 modes); SLO_FLAGS adds flags."},
		},
	}
	Fairness = scenario.Spec{
		Name:    "fairness",
		Summary: "the VTC paper's workloads replayed: token fairness of Sluice vs FCFS vs the paper's numbers",
		New:     func() scenario.Scenario { return &fairnessScenario{} },
		Targets: []scenario.Target{
			{Name: "fairness", FlagsVar: "FAIRNESS_FLAGS", Report: "tests/load/report/fairness.md",
				Notes: "The workloads (../shared/workloads: vtc-overload.csv and vtc-real.csv, beside the checkout) are replayed 4x faster than recorded on one simulator per workload sized as the paper's server (~15 minutes). FAIRNESS_FLAGS adds flags (say -max-tokens-mode 1024, or -duration 120 for a smoke run)."},
			{Name: "fairness-1024", Args: []string{"-max-tokens-mode", "1024"}, Report: "tests/load/report/fairness-1024.md",
				Notes: "Both workloads with max_tokens 1024 for every request (the paper's VTC without the output length known; ~15 minutes)."},
			{Name: "fairness-omitted", Args: []string{"-max-tokens-mode", "omitted"}, Report: "tests/load/report/fairness-omitted.md",
				Notes: "Both workloads with no max_tokens in any request (the paper's VTC without the output length known; ~15 minutes)."},
		},
	}
)
