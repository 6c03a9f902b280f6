package fairness

import (
	"container/heap"
	"fmt"
	"sort"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/slo"
)

// The interactive goal's ceiling. A scheduler in front of a model that
// cannot be preempted hands out sequences only as they free: with batch
// backlogged every sequence is busy, so an interactive arrival waits for
// the next one to finish even if it is served before all of batch. How
// much of the interactive tier can meet a 1 s TTFT then depends on how
// fast sequences free and how the arrivals bunch, not on the scheduler.
// idealInteractive replays a step's arrivals (their times and tiers, as
// sent) through the best such scheduler: work-conserving, every free
// sequence to the oldest interactive request still able to meet its
// TTFT, batch only when none waits, an interactive request past its
// deadline given up (as max_wait refuses it). Each answer holds a
// sequence for the same time; an answer's TTFT is its wait plus a fixed
// path cost. What it attains is the most any non-preemptive,
// work-conserving scheduler can on those arrivals; a scheduler that keeps
// sequences idle for interactive arrivals can do better, at batch's and
// the total goodput's expense.

// freeAt is a min-heap of the times the sequences free.
type freeAt []time.Duration

func (h freeAt) Len() int           { return len(h) }
func (h freeAt) Less(i, j int) bool { return h[i] < h[j] }
func (h freeAt) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *freeAt) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *freeAt) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// idealInteractive is the share of a step's in-window interactive
// arrivals that the ideal scheduler answers within ttft, on seqs
// sequences each answer holds for hold, with path added to every wait.
func idealInteractive(all []*sloArrival, seqs int, hold, path, ttft time.Duration) float64 {
	type job struct {
		at       time.Duration
		tier     int
		inWindow bool
	}
	var jobs []job
	var t0 time.Time
	for i, a := range all {
		if i == 0 || a.at.Before(t0) {
			t0 = a.at
		}
	}
	for _, a := range all {
		if !a.dropped {
			jobs = append(jobs, job{at: a.at.Sub(t0), tier: a.tier, inWindow: a.inWindow})
		}
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].at < jobs[j].at })
	patience := ttft - path
	free := make(freeAt, seqs)
	var waitI, waitB []job
	met, total, next := 0, 0, 0
	for _, j := range jobs {
		if j.tier == slo.Interactive && j.inWindow {
			total++
		}
	}
	for next < len(jobs) || len(waitI) > 0 || len(waitB) > 0 {
		t := heap.Pop(&free).(time.Duration)
		if len(waitI) == 0 && len(waitB) == 0 && next < len(jobs) && jobs[next].at > t {
			t = jobs[next].at // the sequence idles until the next arrival
		}
		for next < len(jobs) && jobs[next].at <= t {
			if jobs[next].tier == slo.Interactive {
				waitI = append(waitI, jobs[next])
			} else {
				waitB = append(waitB, jobs[next])
			}
			next++
		}
		// Interactive requests that can no longer meet their TTFT leave.
		for len(waitI) > 0 && t-waitI[0].at > patience {
			waitI = waitI[1:]
		}
		switch {
		case len(waitI) > 0:
			if waitI[0].inWindow {
				met++
			}
			waitI = waitI[1:]
			heap.Push(&free, t+hold)
		case len(waitB) > 0:
			waitB = waitB[1:]
			heap.Push(&free, t+hold)
		default:
			heap.Push(&free, t)
			if next >= len(jobs) {
				return shareOf(met, total)
			}
		}
	}
	return shareOf(met, total)
}

func shareOf(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// idealText is the ceiling at a step, for two path costs: the
// simulator's own (FCFS's interactive TTFT p50 at the lightest load) and
// Sluice's (its own at the lightest load).
func (s *sloScenario) idealText(st *sloStep) string {
	if st == nil || s.measured <= 0 {
		return ""
	}
	light := s.loadList[0]
	hold := time.Duration(float64(s.seqs) / s.measured * float64(time.Second))
	ttft := slo.Tiers[slo.Interactive].TTFT
	out := fmt.Sprintf("ceiling on the same arrivals (the best work-conserving scheduler that does not preempt: %d sequences each holding an answer %v, interactive first): ",
		s.seqs, hold.Round(time.Millisecond))
	sep := ""
	for _, m := range []string{modeFCFS, st.mode} {
		base := s.find(m, light)
		if base == nil {
			continue
		}
		sum := summarize(base.all, slo.Interactive)
		if len(sum.ttft) == 0 {
			continue
		}
		path := sum.ttft.At(50)
		out += fmt.Sprintf("%s%s with %s's path (its interactive TTFT p50 at %g×, %v)", sep,
			pct(idealInteractive(st.all, s.seqs, hold, path, ttft)), modeName(m), light, path.Round(time.Millisecond))
		sep = "; "
	}
	return out
}
