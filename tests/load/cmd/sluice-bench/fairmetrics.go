package main

import (
	"math"
	"sort"
)

// The fairness scenario's metrics, as the VTC paper's artifact computes
// them (Ying1123/VTC-artifact, fair_bench/plot/visualize.py and
// plot_revision.py: T = 600 s, warm-up 30 s, 20 steps, 60 s windows), on
// times the client recorded, in trace seconds:
//
//   - a request's service is prompt + 2 × output tokens, spread evenly
//     over the time from its first token to its last;
//   - tick i (1..19) is x_i = i × (T − warm-up) / 20;
//   - a client's accumulated service at tick x_i is its service within
//     [warm-up, warm-up + x_i]; the accumulated difference is the largest
//     client's minus the smallest's;
//   - at tick x_i the window is warm-up + x_i ± 30 s; a client's service
//     rate s is its service within the window over 60 s, its demand rate
//     d the service of the requests that arrived within it over 60 s; the
//     windowed difference sums min(max s − s, |d − s|) over the clients;
//     Max Diff and Avg Diff are its largest and mean value over the ticks;
//   - throughput is prompt + output tokens per second (here: spread over
//     each request's first to last token like service, within the
//     measured span [warm-up, T]).
//
// Clients are every client of the trace, served or not: the artifact
// takes the clients of its (fully drained, so complete) responses.

// fairReq is one request of a replay as its client saw it.
type fairReq struct {
	client string
	// arrival is when the trace sends it; prompt and output are its
	// recorded lengths, its demand.
	arrival        float64
	prompt, output int
	// served is whether any token came; first and last are the trace
	// times of its first and last token, and gotPrompt and gotOutput the
	// prompt and output tokens it was served.
	served               bool
	first, last          float64
	gotPrompt, gotOutput int
}

// vtcService is the paper's cost of a request: a decoded token counts
// twice a prompt token.
func vtcService(prompt, output int) float64 { return float64(prompt + 2*output) }

// fairSpec is the measurement's shape.
type fairSpec struct {
	// span is T, warmup the start of accumulation, window the length of
	// a windowed reading, steps the number of tick intervals (ticks are
	// 1..steps−1).
	span, warmup, window float64
	steps                int
}

// paperSpec is the artifact's.
var paperSpec = fairSpec{span: 600, warmup: 30, window: 60, steps: 20}

// fairResult is one replay's metrics.
type fairResult struct {
	ticks []float64
	// accDiff and winDiff are per tick.
	accDiff, winDiff []float64
	maxDiff, avgDiff float64
	// throughput is prompt + output tokens per trace second.
	throughput float64
}

// ticks are the spec's reading times, x_1..x_{steps−1}.
func (s fairSpec) ticks() []float64 {
	step := (s.span - s.warmup) / float64(s.steps)
	out := make([]float64, 0, s.steps-1)
	for i := 1; i < s.steps; i++ {
		out = append(out, float64(i)*step)
	}
	return out
}

// overlapShare is the part of a request's service that falls within
// [l, r], spread evenly over [first, last]. A request whose tokens came
// at one instant has all of it there (counted in [l, r), so that
// abutting windows do not count it twice).
func (q fairReq) overlapShare(l, r float64) float64 {
	if !q.served {
		return 0
	}
	if q.last-q.first < 1e-9 {
		if q.first >= l && q.first < r {
			return 1
		}
		return 0
	}
	return math.Max(math.Min(r, q.last)-math.Max(l, q.first), 0) / (q.last - q.first)
}

// serviceIn is each client's service within [l, r].
func serviceIn(reqs []fairReq, clients []string, l, r float64) []float64 {
	idx := clientIndex(clients)
	out := make([]float64, len(clients))
	for _, q := range reqs {
		out[idx[q.client]] += vtcService(q.gotPrompt, q.gotOutput) * q.overlapShare(l, r)
	}
	return out
}

// demandIn is each client's recorded service of the requests that
// arrived within [l, r].
func demandIn(reqs []fairReq, clients []string, l, r float64) []float64 {
	idx := clientIndex(clients)
	out := make([]float64, len(clients))
	for _, q := range reqs {
		if q.arrival >= l && q.arrival <= r {
			out[idx[q.client]] += vtcService(q.prompt, q.output)
		}
	}
	return out
}

func clientIndex(clients []string) map[string]int {
	idx := make(map[string]int, len(clients))
	for i, c := range clients {
		idx[c] = i
	}
	return idx
}

// traceClients are the clients of reqs, sorted.
func traceClients(reqs []fairReq) []string {
	seen := map[string]bool{}
	var out []string
	for _, q := range reqs {
		if !seen[q.client] {
			seen[q.client] = true
			out = append(out, q.client)
		}
	}
	sort.Strings(out)
	return out
}

// measureFairness computes the metrics of one replay.
func measureFairness(reqs []fairReq, spec fairSpec) fairResult {
	clients := traceClients(reqs)
	res := fairResult{ticks: spec.ticks()}
	for _, x := range res.ticks {
		acc := serviceIn(reqs, clients, spec.warmup, spec.warmup+x)
		res.accDiff = append(res.accDiff, maxMinusMin(acc))
		mid := spec.warmup + x
		l, r := mid-spec.window/2, mid+spec.window/2
		res.winDiff = append(res.winDiff, windowedDiff(scale(serviceIn(reqs, clients, l, r), 1/spec.window), scale(demandIn(reqs, clients, l, r), 1/spec.window)))
	}
	for _, d := range res.winDiff {
		res.maxDiff = math.Max(res.maxDiff, d)
		res.avgDiff += d / float64(len(res.winDiff))
	}
	res.throughput = throughputIn(reqs, spec.warmup, spec.span)
	return res
}

// windowedDiff is the artifact's sum over clients of min(max s − s,
// |d − s|): how far each client falls short of the best-served one or of
// its own demand, whichever is nearer.
func windowedDiff(service, demand []float64) float64 {
	best := 0.0
	for _, s := range service {
		best = math.Max(best, s)
	}
	sum := 0.0
	for j, s := range service {
		sum += math.Min(best-s, math.Abs(demand[j]-s))
	}
	return sum
}

// throughputIn is prompt + output tokens served per second within
// [l, r], each request's spread over its first to last token.
func throughputIn(reqs []fairReq, l, r float64) float64 {
	tok := 0.0
	for _, q := range reqs {
		tok += float64(q.gotPrompt+q.gotOutput) * q.overlapShare(l, r)
	}
	return tok / (r - l)
}

// maxMinusMin is the largest value minus the smallest.
func maxMinusMin(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return hi - lo
}

func scale(xs []float64, f float64) []float64 {
	for i := range xs {
		xs[i] *= f
	}
	return xs
}
