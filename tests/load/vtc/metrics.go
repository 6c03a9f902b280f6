package vtc

import (
	"math"
	"sort"
)

// The paper's metrics, as its artifact computes them
// (Ying1123/VTC-artifact, fair_bench/plot/visualize.py and
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

// Req is one request of a replay as its client saw it.
type Req struct {
	Client string
	// Arrival is when the trace sends it; Prompt and Output are its
	// recorded lengths, its demand.
	Arrival        float64
	Prompt, Output int
	// Served is whether any token came; First and Last are the trace
	// times of its first and last token, and GotPrompt and GotOutput the
	// prompt and output tokens it was served.
	Served               bool
	First, Last          float64
	GotPrompt, GotOutput int
}

// vtcService is the paper's cost of a request: a decoded token counts
// twice a prompt token.
func vtcService(prompt, output int) float64 { return float64(prompt + 2*output) }

// Spec is the measurement's shape.
type Spec struct {
	// Span is T, Warmup the start of accumulation, Window the length of
	// a windowed reading, Steps the number of tick intervals (ticks are
	// 1..Steps−1).
	Span, Warmup, Window float64
	Steps                int
}

// PaperSpec is the artifact's.
var PaperSpec = Spec{Span: 600, Warmup: 30, Window: 60, Steps: 20}

// Result is one replay's metrics.
type Result struct {
	Ticks []float64
	// AccDiff and WinDiff are per tick.
	AccDiff, WinDiff []float64
	MaxDiff, AvgDiff float64
	// Throughput is prompt + output tokens per trace second.
	Throughput float64
}

// Ticks are the spec's reading times, x_1..x_{Steps−1}.
func (s Spec) Ticks() []float64 {
	step := (s.Span - s.Warmup) / float64(s.Steps)
	out := make([]float64, 0, s.Steps-1)
	for i := 1; i < s.Steps; i++ {
		out = append(out, float64(i)*step)
	}
	return out
}

// overlapShare is the part of a request's service that falls within
// [l, r], spread evenly over [First, Last]. A request whose tokens came
// at one instant has all of it there (counted in [l, r), so that
// abutting windows do not count it twice).
func (q Req) overlapShare(l, r float64) float64 {
	if !q.Served {
		return 0
	}
	if q.Last-q.First < 1e-9 {
		if q.First >= l && q.First < r {
			return 1
		}
		return 0
	}
	return math.Max(math.Min(r, q.Last)-math.Max(l, q.First), 0) / (q.Last - q.First)
}

// serviceIn is each client's service within [l, r].
func serviceIn(reqs []Req, clients []string, l, r float64) []float64 {
	idx := clientIndex(clients)
	out := make([]float64, len(clients))
	for _, q := range reqs {
		out[idx[q.Client]] += vtcService(q.GotPrompt, q.GotOutput) * q.overlapShare(l, r)
	}
	return out
}

// demandIn is each client's recorded service of the requests that
// arrived within [l, r].
func demandIn(reqs []Req, clients []string, l, r float64) []float64 {
	idx := clientIndex(clients)
	out := make([]float64, len(clients))
	for _, q := range reqs {
		if q.Arrival >= l && q.Arrival <= r {
			out[idx[q.Client]] += vtcService(q.Prompt, q.Output)
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

// Clients are the clients of reqs, sorted.
func Clients(reqs []Req) []string {
	seen := map[string]bool{}
	var out []string
	for _, q := range reqs {
		if !seen[q.Client] {
			seen[q.Client] = true
			out = append(out, q.Client)
		}
	}
	sort.Strings(out)
	return out
}

// Measure computes the metrics of one replay.
func Measure(reqs []Req, spec Spec) Result {
	clients := Clients(reqs)
	res := Result{Ticks: spec.Ticks()}
	for _, x := range res.Ticks {
		acc := serviceIn(reqs, clients, spec.Warmup, spec.Warmup+x)
		res.AccDiff = append(res.AccDiff, maxMinusMin(acc))
		mid := spec.Warmup + x
		l, r := mid-spec.Window/2, mid+spec.Window/2
		res.WinDiff = append(res.WinDiff, windowedDiff(scale(serviceIn(reqs, clients, l, r), 1/spec.Window), scale(demandIn(reqs, clients, l, r), 1/spec.Window)))
	}
	for _, d := range res.WinDiff {
		res.MaxDiff = math.Max(res.MaxDiff, d)
		res.AvgDiff += d / float64(len(res.WinDiff))
	}
	res.Throughput = throughputIn(reqs, spec.Warmup, spec.Span)
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
func throughputIn(reqs []Req, l, r float64) float64 {
	tok := 0.0
	for _, q := range reqs {
		tok += float64(q.GotPrompt+q.GotOutput) * q.overlapShare(l, r)
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
