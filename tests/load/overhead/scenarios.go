// Package overhead holds the scenarios that measure what Sluice's
// machinery costs: per request against a bare workflow (overhead), per
// limiter decision (limiter), per refusal (reject), per wake-up of a
// queued request (wakeup) and per waiting request (waiters).
package overhead

import "github.com/sluice-dev/sluice/tests/load/internal/scenario"

// The scenarios of this package: what Sluice's machinery costs, per
// request, per limiter decision, per refusal, per wake-up and per
// waiting request.
var (
	Overhead = scenario.Spec{
		Name:    "overhead",
		Summary: "what Sluice adds on top of the LLM, vs a bare Temporal workflow (default)",
		New:     func() scenario.Scenario { return &overheadScenario{} },
		Targets: []scenario.Target{{Name: "overhead", Args: []string{"-n", "200"}, Report: "tests/load/report/overhead.md"}},
	}
	Limiter = scenario.Spec{
		Name:    "limiter",
		Summary: "limiter.Reserve decisions/s vs redis-benchmark SET; p99 at half that rate",
		New:     func() scenario.Scenario { return &limiterScenario{} },
		Targets: []scenario.Target{{Name: "limiter", Report: "tests/load/report/limiter.md"}},
	}
	Reject = scenario.Spec{
		Name:    "reject",
		Summary: "429 path through POST /v1/chat: rejections/s, latency, no workflow started",
		New:     func() scenario.Scenario { return &rejectScenario{} },
		Targets: []scenario.Target{{Name: "reject", Report: "tests/load/report/reject.md",
			Notes: "When wrk is installed (apt-get install wrk) it drives the API with it too: a client light enough to leave the server the CPU."}},
	}
	Wakeup = scenario.Spec{
		Name:    "wakeup",
		Summary: "permit release to the next waiter's retrieval stage, end to end",
		New:     func() scenario.Scenario { return &wakeupScenario{} },
		Targets: []scenario.Target{{Name: "wakeup", Report: "tests/load/report/wakeup.md"}},
	}
	Waiters = scenario.Spec{
		Name:    "waiters",
		Summary: "10,000 queued workflows on one worker: RSS, goroutines, drain",
		New:     func() scenario.Scenario { return &waitersScenario{} },
		Targets: []scenario.Target{{Name: "waiters", Report: "tests/load/report/waiters.md", Notes: "About 15 minutes."}},
	}
)
