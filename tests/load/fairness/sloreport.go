package fairness

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
)

// The slo report: per step, mode and tier what the window's arrivals got
// against their tier's SLO; each tier's tokens while both were
// backlogged; the goals; and the published numbers beside ours.

// Outcomes of an arrival, judged against its tier's SLO.
const (
	outMet      = "in SLO"
	outLate     = "late"      // answered, outside the SLO
	outRefused  = "refused"   // a rejected event, or an HTTP refusal
	outTimedOut = "timed out" // the client's patience ran out first
	outOther    = "other"     // errors, streams cut
	outDropped  = "dropped"   // the generator did not send it
)

// outcomeOf judges an arrival against its tier's SLO.
func outcomeOf(a *sloArrival) string {
	t, k := slo.Tiers[a.tier], a.res.Kind
	switch {
	case a.dropped:
		return outDropped
	case k == chat.KindDone:
		if t.Meets(a.res) {
			return outMet
		}
		return outLate
	case strings.HasPrefix(k, "rejected ") || strings.HasPrefix(k, "HTTP "):
		return outRefused
	case k == chat.KindHang:
		return outTimedOut
	}
	return outOther
}

// tierSummary is what a tier's arrivals within a window got.
type tierSummary struct {
	arrivals int
	outcomes map[string]int
	// ttft is of the arrivals that got a first token; tpot of the
	// answers of two tokens or more.
	ttft, tpot stats.Latencies
}

// summarize sums up the window's arrivals of tier, or of every tier (-1),
// each judged by its own tier's SLO.
func summarize(all []*sloArrival, tier int) tierSummary {
	s := tierSummary{outcomes: map[string]int{}}
	var ttft, tpot []time.Duration
	for _, a := range all {
		if !a.inWindow || (tier >= 0 && a.tier != tier) {
			continue
		}
		s.arrivals++
		s.outcomes[outcomeOf(a)]++
		if a.res.Tokens > 0 {
			ttft = append(ttft, a.res.TTFT)
		}
		if p, ok := slo.Pace(a.res); ok && a.res.Kind == chat.KindDone {
			tpot = append(tpot, p)
		}
	}
	s.ttft, s.tpot = stats.Sorted(ttft), stats.Sorted(tpot)
	return s
}

// attainment is the share of arrivals answered within their SLO: one
// refused, timed out or dropped counts as missed.
func (s tierSummary) attainment() float64 {
	if s.arrivals == 0 {
		return 0
	}
	return float64(s.outcomes[outMet]) / float64(s.arrivals)
}

// goodput is the answers within their SLO per second of the window the
// arrivals came in.
func (s tierSummary) goodput(window time.Duration) float64 {
	return float64(s.outcomes[outMet]) / window.Seconds()
}

// backloggedTokens is the tokens granted to each tier in the sample
// periods (the interval before each look) that found every tier waiting,
// and how many looks did. Weighted fair queuing shares its grants by
// cost, so an answer counts where its grant was, seen from the client as
// its first token, with what it was served (prompt and output tokens as
// its done event reports them; the streamed tokens of one cut short).
func backloggedTokens(all []*sloArrival, samples []backlogSample, every time.Duration) (tokens [len(slo.Tiers)]float64, both int) {
	for _, s := range samples {
		if !allTrue(s.waiting[:]) {
			continue
		}
		both++
		lo, hi := s.at.Add(-every), s.at
		for _, a := range all {
			if a.res.Tokens == 0 {
				continue
			}
			if first := a.at.Add(a.res.TTFT); first.After(lo) && !first.After(hi) {
				tokens[a.tier] += float64(max(a.res.Served, a.res.Tokens))
			}
		}
	}
	return tokens, both
}

func allTrue(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}

// weightedShare is tier's share of the tokens by weight when every tier
// is backlogged.
func weightedShare(tier int) float64 {
	sum := 0
	for _, t := range slo.Tiers {
		sum += t.Weight
	}
	return float64(slo.Tiers[tier].Weight) / float64(sum)
}

// sloDur is a latency in ms below a second, in seconds above.
func sloDur(l stats.Latencies, p float64) string {
	if len(l) == 0 {
		return "—"
	}
	d := l.At(p)
	if d < time.Second {
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

// stepsOf are a mode's steps at a load, one a seed, in seed order.
func (s *sloScenario) stepsOf(mode string, mult float64) []*sloStep {
	var out []*sloStep
	for _, st := range s.steps {
		if st.mode == mode && st.mult == mult {
			out = append(out, st)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].run < out[j].run })
	return out
}

// stepAt is a mode's step at a load for one seed (nil: none ran).
func (s *sloScenario) stepAt(mode string, mult float64, run int) *sloStep {
	for _, st := range s.steps {
		if st.mode == mode && st.mult == mult && st.run == run {
			return st
		}
	}
	return nil
}

// pooled is every arrival of a mode's steps at a load, over the seeds.
func (s *sloScenario) pooled(mode string, mult float64) []*sloArrival {
	var all []*sloArrival
	for _, st := range s.stepsOf(mode, mult) {
		all = append(all, st.all...)
	}
	return all
}

// meanDrawn is the mean answer length drawn for the window's arrivals.
func meanDrawn(all []*sloArrival) float64 {
	sum, n := 0, 0
	for _, a := range all {
		if a.inWindow {
			sum, n = sum+a.tokens, n+1
		}
	}
	return shareOf(sum, n)
}

// otherKinds lists the exact kinds of a step's window's arrivals that
// missed their SLO (not answered, or answered late: first token or
// pace), each with the median time its clients took to learn it.
func otherKinds(all []*sloArrival) string {
	took := map[string][]time.Duration{}
	for _, a := range all {
		if !a.inWindow || a.dropped {
			continue
		}
		t := slo.Tiers[a.tier]
		k := t.Name + " " + a.res.Kind
		if a.res.Kind == chat.KindDone {
			// Answered but late: say which bound it missed.
			if t.Meets(a.res) {
				continue
			}
			k = t.Name + " answered, first token late"
			if a.res.TTFT <= t.TTFT {
				k = t.Name + " answered, pace too slow"
			}
		}
		took[k] = append(took[k], a.took)
	}
	parts := make([]string, 0, len(took))
	for k, ds := range took {
		parts = append(parts, fmt.Sprintf("%s %d (after %s p50)", k, len(ds), sloDur(stats.Sorted(ds), 50)))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// line is the step's one-line summary, for stderr as it ends.
func (s *sloStep) line() string {
	var parts []string
	for i, t := range slo.Tiers {
		sum := summarize(s.all, i)
		parts = append(parts, fmt.Sprintf("%s %d arrivals, attainment %s, TTFT p99 %s", t.Name, sum.arrivals, pct(sum.attainment()), sloDur(sum.ttft, 99)))
	}
	return s.label() + ": " + strings.Join(parts, "; ")
}
