package heal

import (
	"fmt"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
)

// The heal bench's verdict where the client stands: each pool's clients'
// time to first token (from the POST, waiting included), their answers
// within an SLO, and the queue timeouts — what the healer is for, rather
// than a stage's tail after admission, which a healer that moves waiting
// into the queue can improve while clients wait longer.

// healSLO is the first-token SLO a pool's clients are judged by: the
// short pool's interactive second (the SLO benchmark's interactive tier),
// the long pool's minute (its batch tier).
var healSLO = map[string]time.Duration{request.PoolShort: time.Second, request.PoolLong: time.Minute}

// clientTally is one pool's clients in one mode.
type clientTally struct {
	mu                                 sync.Mutex
	sent, answers, withinSLO, timeouts int
	ttft                               []time.Duration
	slo                                time.Duration
}

func newClientTallies() map[string]*clientTally {
	out := map[string]*clientTally{}
	for _, p := range healPools {
		out[p] = &clientTally{slo: healSLO[p]}
	}
	return out
}

func (c *clientTally) add(res chat.Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if res.Kind == chat.KindHang {
		return // cut off at the end: not measured
	}
	c.sent++
	switch res.Kind {
	case chat.KindDone:
		c.answers++
		c.ttft = append(c.ttft, res.TTFT)
		if res.TTFT <= c.slo {
			c.withinSLO++
		}
	case "rejected queue_timeout":
		c.timeouts++
	}
}

// attainment is the share of the pool's requests answered with a first
// token within the SLO; a refused or timed-out request missed it.
func (c *clientTally) attainment() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent == 0 {
		return 0
	}
	return float64(c.withinSLO) / float64(c.sent)
}

// row is the pool's line of the client table.
func (c *clientTally) row(mode, pool string) []string {
	c.mu.Lock()
	l := stats.Sorted(c.ttft)
	sent, answers, timeouts := c.sent, c.answers, c.timeouts
	c.mu.Unlock()
	return []string{mode, pool, fmt.Sprint(sent), fmt.Sprint(answers), fmt.Sprint(timeouts),
		stats.DurOrDash(l, 50), stats.DurOrDash(l, 99), fmt.Sprintf("%.1f%% (≤ %v)", 100*c.attainment(), c.slo)}
}

// clientTable writes every mode's client table to md.
func clientTable(runs []*healRun) string {
	out := "| mode | pool | requests | answers | queue_timeout | TTFT p50 | TTFT p99 | first token within SLO |\n|---|---|---:|---:|---:|---:|---:|---:|\n"
	for _, r := range runs {
		if r.Clients == nil {
			continue
		}
		for _, p := range healPools {
			cells := r.Clients[p].row(r.Mode, p)
			line := "|"
			for _, c := range cells {
				line += " " + c + " |"
			}
			out += line + "\n"
		}
	}
	return out
}

// healNoise is how much worse a client measure of healing on may be than
// off's and still count as no worse: the two modes see the same arrivals,
// but a 2-core machine's scheduling moves a p99 by a few percent.
const healNoise = 0.10

// clientVerdicts judge healing on against off where clients stand: the
// short pool's clients are served no worse (TTFT p99, first tokens within
// its promise), what protecting them costs the long pool's clients is
// bounded, and neither pool's queue timeouts grow.
func clientVerdicts(runs []*healRun) []report.Goal {
	by := map[string]*healRun{}
	for _, r := range runs {
		by[r.Mode] = r
	}
	off, on := by["off"], by["on"]
	if off == nil || on == nil || off.Clients == nil || on.Clients == nil {
		return nil
	}
	var v []report.Goal
	p99 := func(c *clientTally) time.Duration {
		c.mu.Lock()
		defer c.mu.Unlock()
		return stats.Sorted(c.ttft).At(99)
	}
	noWorse := fmt.Sprintf("on <= off × %.1f", 1+healNoise)
	for _, p := range healPools {
		a, b := on.Clients[p], off.Clients[p]
		what := fmt.Sprintf("clients: %s pool TTFT p99, healing on vs off", p)
		if p == request.PoolLong {
			what += " (what protecting the short pool costs)"
		}
		v = append(v, report.NewGoal(what, fmt.Sprintf("%s vs %s", stats.Ms(p99(a)), stats.Ms(p99(b))), noWorse,
			float64(p99(a)) <= (1+healNoise)*float64(p99(b))))
	}
	sn, so := on.Clients[request.PoolShort], off.Clients[request.PoolShort]
	v = append(v, report.NewGoal(fmt.Sprintf("clients: short pool first tokens within %v, healing on vs off", sn.slo),
		fmt.Sprintf("%.1f%% vs %.1f%%", 100*sn.attainment(), 100*so.attainment()), "on >= off - 2 points", sn.attainment() >= so.attainment()-0.02))
	for _, p := range healPools {
		a, b := on.Clients[p], off.Clients[p]
		v = append(v, report.NewGoal(fmt.Sprintf("clients: %s pool queue timeouts, healing on vs off", p), fmt.Sprintf("%d vs %d", a.timeouts, b.timeouts),
			"on <= off + max(2, 10%)", a.timeouts <= b.timeouts+max(2, b.timeouts/10)))
	}
	return v
}
