package fairness

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
)

// poolsProbeTTFT is the light tenant's first-token goal: the interactive
// tier's TTFT goal of the SLO benchmark (issue 25), a short question's
// first token within a second while both heavy tenants are backlogged.
const poolsProbeTTFT = time.Second

// poolsShareGap is how far apart, in points of the two heavy tenants'
// tokens, equal weights may end: ±5 points of a half.
const poolsShareGap = 0.10

// tenantSummary is one tenant's requests that ended within the window.
type tenantSummary struct {
	ended, answers, timeouts, other int
	served                          int
	ttft, total, admitted           stats.Latencies
}

func (r *poolsRun) summary(tenant string) tenantSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s tenantSummary
	var ttft, total, admitted []time.Duration
	for _, res := range r.results[tenant] {
		if res.end.Before(r.winStart) || res.end.After(r.winEnd) {
			continue
		}
		s.ended++
		switch {
		case res.Kind == chat.KindDone:
			s.answers++
			s.served += res.Served
			ttft = append(ttft, res.TTFT)
			total = append(total, res.total)
			admitted = append(admitted, res.Admitted)
		case res.Kind == "rejected queue_timeout":
			s.timeouts++
		case res.Kind == chat.KindHang:
			// cut at the window's end: neither answered nor refused
			s.ended--
		default:
			s.other++
		}
	}
	s.ttft, s.total, s.admitted = stats.Sorted(ttft), stats.Sorted(total), stats.Sorted(admitted)
	return s
}

func (p *poolsScenario) Report(r *report.Report) error {
	d := config.Default()
	r.Header(fmt.Sprintf("make run's configuration (pools on one simulator: short may hold %d, long %d, of a shared %d; healing %v), three tenants of one weight and no rate limits: %d closed-loop clients asking long questions (the long pool), %d asking short ones, and a light one asking a short question every %v after its last; %v warm-up, then a %v window; side by side on fresh stacks: shared (as configured) and apart (the long pool names the simulator by another address, permits %d/%d as before pools shared)",
		d.Pools.Short.MaxConcurrency, d.Pools.Long.MaxConcurrency, d.Pools.SharedLimit(), p.healing, p.clients, p.clients, p.probeEvery,
		p.warmup, p.window, p.apartShort, p.apartLong))
	for _, run := range p.runs {
		p.runTable(r, run)
	}
	for _, run := range p.runs {
		if run.mode == "shared" {
			p.goals(r, run)
		}
	}
	r.Linef("")
	r.Linef("Tokens are each answer's prompt and completion tokens as its done event reports them; TTFT runs from the client's POST to its first token, waiting included; admitted, from the POST to the first stage after admission (the door, the stages before admission and the queue). Backlogged: the share of once-a-second looks at the queues that found the tenant waiting. The light tenant's share is left out of the heavy ones' split. Permit utilisation: what the window added to each pool's sluice_permit_decoding_seconds_total (first token to the stream's end) over what it added to sluice_permit_held_seconds_total (grant to release), read from the API's /metrics at the window's start and end; the rest of a held permit's time is prefill and queueing in the simulator, the rest of the wait for the first token and the release after the last.")
	return nil
}

func (p *poolsScenario) runTable(r *report.Report, run *poolsRun) {
	long, short := run.summary("long"), run.summary("short")
	heavy := long.served + short.served
	r.Linef("")
	r.Linef("mode %s: the simulator held at most %d sequences at once (running and waiting) and runs %d", run.mode, run.seenSim, run.simSeqs)
	r.Linef("")
	r.Linef("mode %s: permit utilisation (decoding / held seconds in the window): %s", run.mode, run.permits.line())
	r.Linef("")
	r.Table("tenant", "ended in window", "answers", "tokens served", "share of the heavy tokens", "queue_timeout", "other", "admitted p50", "admitted p99", "TTFT p50", "TTFT p99", "answer p50", "backlogged")
	for _, tenant := range poolsTenants {
		s := run.summary(tenant)
		share := "—"
		if tenant != "probe" && heavy > 0 {
			share = fmt.Sprintf("%.1f%%", 100*float64(s.served)/float64(heavy))
		}
		r.Row(tenant, fmt.Sprint(s.ended), fmt.Sprint(s.answers), stats.Thousands(int64(s.served)), share,
			fmt.Sprint(s.timeouts), fmt.Sprint(s.other), stats.DurOrDash(s.admitted, 50), stats.DurOrDash(s.admitted, 99), stats.DurOrDash(s.ttft, 50), stats.DurOrDash(s.ttft, 99), stats.DurOrDash(s.total, 50), run.backloggedShare(tenant))
	}
}

func (r *poolsRun) backloggedShare(tenant string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.samples == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(r.backlogged[tenant])/float64(r.samples))
}

func (p *poolsScenario) goals(r *report.Report, run *poolsRun) {
	long, short, probe := run.summary("long"), run.summary("short"), run.summary("probe")
	heavy := long.served + short.served
	r.Linef("")
	if heavy == 0 {
		r.Goal("heavy tenants' token shares", "nothing served", "within 10 points", false)
		return
	}
	ls, ss := float64(long.served)/float64(heavy), float64(short.served)/float64(heavy)
	r.Goal("equal-weight tenants' shares of the tokens served, long vs short pool", fmt.Sprintf("%.1f%% / %.1f%%", 100*ls, 100*ss),
		fmt.Sprintf("within %.0f points", 100*poolsShareGap), math.Abs(ls-ss) <= poolsShareGap)
	p99 := "no answer"
	met := false
	if len(probe.ttft) > 0 {
		p99, met = stats.Ms(probe.ttft.At(99)), probe.ttft.At(99) <= poolsProbeTTFT
	}
	r.Goal("the light short-question tenant's TTFT p99", p99, "<= "+stats.Ms(poolsProbeTTFT), met)
	r.Goal("most sequences at the simulator at once", fmt.Sprint(run.seenSim), fmt.Sprintf("<= %d (what it runs)", run.simSeqs), run.seenSim <= run.simSeqs)
	if other := otherOutcomes(run); other != "" {
		r.Linef("other outcomes in the window: %s", other)
	}
}

// otherOutcomes lists the outcomes other than answers and queue timeouts.
func otherOutcomes(run *poolsRun) string {
	run.mu.Lock()
	defer run.mu.Unlock()
	count := map[string]int{}
	for _, rs := range run.results {
		for _, res := range rs {
			if res.end.Before(run.winStart) || res.end.After(run.winEnd) {
				continue
			}
			if res.Kind != chat.KindDone && res.Kind != "rejected queue_timeout" && res.Kind != chat.KindHang {
				count[res.Kind]++
			}
		}
	}
	var parts []string
	for k, n := range count {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
