package fairness

import (
	"container/heap"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/slo"
)

// The interactive goal's ceiling without preemption. A scheduler in
// front of a model that cannot be preempted hands out sequences only as
// they free: with batch backlogged every sequence is busy, so an
// interactive arrival waits for the next one to finish even if it is
// served before all of batch. How much of the interactive tier can meet
// a 1 s TTFT then depends on how fast sequences free and how the
// arrivals bunch, not on the scheduler. idealInteractive replays a
// step's arrivals (their times, tiers and answer lengths, as sent)
// through the best such scheduler: work-conserving, every free sequence
// to the oldest interactive request still able to meet its TTFT, batch
// (oldest first) only when none waits, an interactive request past its
// deadline given up (as max_wait refuses it).
//
// What it assumes: an answer holds its sequence for a time proportional
// to its length (hold), the measured mean answer time at a full batch
// for the mean length (a batch's decode step costs the same whoever is
// in it, and the prompt's prefill is a few ms beside an answer's
// seconds); an answer's TTFT is its wait plus a fixed path cost. It does
// not use the lengths to choose: starting batch's shortest answers first
// would free sequences sooner and could do better, at the long answers'
// expense, and no scheduler measured here knows to do it. So it is the
// most any non-preemptive, work-conserving scheduler that serves each
// tier in arrival order attains on those arrivals; one that keeps
// sequences idle for interactive arrivals can do better, at batch's and
// the total goodput's expense, and one that preempts can do better
// still. It is a model, its hold and path measured means: at 2× the
// interactive waits sit near the TTFT bound, where a few milliseconds
// move an arrival across, so a real run on the same arrivals lands a few
// points either side of it; the median over the seeds is what to read.

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

// idealJob is an arrival as the ideal scheduler sees it.
type idealJob struct {
	at       time.Duration
	tier     int
	tokens   int
	inWindow bool
}

// idealJobs are a step's sent arrivals, in arrival order, their times
// from the first.
func idealJobs(all []*sloArrival) []idealJob {
	var jobs []idealJob
	var t0 time.Time
	for i, a := range all {
		if i == 0 || a.at.Before(t0) {
			t0 = a.at
		}
	}
	for _, a := range all {
		if !a.dropped {
			jobs = append(jobs, idealJob{at: a.at.Sub(t0), tier: a.tier, tokens: a.tokens, inWindow: a.inWindow})
		}
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].at < jobs[j].at })
	return jobs
}

// idealInteractive is the share of a step's in-window interactive
// arrivals that the ideal scheduler answers within ttft, on seqs
// sequences, each answer holding one for hold(its tokens), with path
// added to every wait.
func idealInteractive(all []*sloArrival, seqs int, hold func(tokens int) time.Duration, path, ttft time.Duration) float64 {
	jobs := idealJobs(all)
	patience := ttft - path
	free := make(freeAt, seqs)
	var waitI, waitB []idealJob
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
			heap.Push(&free, t+hold(waitI[0].tokens))
			waitI = waitI[1:]
		case len(waitB) > 0:
			heap.Push(&free, t+hold(waitB[0].tokens))
			waitB = waitB[1:]
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

// hold is how long an answer of tokens holds its sequence: the measured
// mean answer time at a full batch, in proportion to its length against
// the mean's.
func (s *sloScenario) hold(tokens int) time.Duration {
	return time.Duration(float64(s.meanAnswer) * float64(tokens) / s.workload.mean)
}

// ceilingPath is the path cost the ceiling adds to every wait: the
// simulator's own, FCFS's interactive TTFT p50 at the lightest load run
// (over every seed), the least any scheduler in front of it adds; a
// Sluice mode's when FCFS did not run. None when the lightest load is
// over 1× (queueing is in every TTFT there). It returns the words saying
// which.
func (s *sloScenario) ceilingPath() (time.Duration, string) {
	light := s.loadList[0]
	for _, m := range s.loadList {
		light = min(light, m)
	}
	if light > sloNominal {
		return 0, "no path cost (no step at 1× or less to take it from)"
	}
	mode := modeFCFS
	if !slices.Contains(s.modeList, modeFCFS) {
		mode = s.modeList[0]
	}
	sum := summarize(s.pooled(mode, light), slo.Interactive)
	if len(sum.ttft) == 0 {
		return 0, "no path cost (no interactive first token at the lightest load)"
	}
	path := sum.ttft.At(50)
	return path, fmt.Sprintf("%s's path cost: its interactive TTFT p50 at %g×, %v", modeName(mode), light, path.Round(time.Millisecond))
}

// ceiling is the ideal scheduler's interactive attainment on a step's
// arrivals with path added to every wait.
func (s *sloScenario) ceiling(st *sloStep, path time.Duration) float64 {
	return idealInteractive(st.all, s.seqs, s.hold, path, slo.Tiers[slo.Interactive].TTFT)
}
