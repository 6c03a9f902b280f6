package fairness

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/tests/load/vtc"
)

// The slo benchmark's workloads: how long each arrival's answer is.
// A sequence of the model is held for as long as its answer lasts, so
// the lengths set how often sequences free, which is what a scheduler
// that does not preempt waits for. Every answer the same length frees
// the sequences in clumps; the VTC real trace's recorded answers
// (LMSYS chat) spread them as a production mix does.
const (
	workloadFixed = "fixed"
	workloadVTC   = "vtc"
)

// sloWorkload draws each arrival's answer length.
type sloWorkload struct {
	name string
	// lengths are what an arrival's answer length is drawn from, each
	// equally likely (one, for fixed).
	lengths []int
	mean    float64
	// source says where the lengths come from, for the report.
	source string
	// directive: each request carries the simulator's answer-length
	// directive; without it every answer is the simulator's natural
	// length, which is the mean's.
	directive bool
}

// newSLOWorkload is the workload named: fixed answers of fixedTokens,
// or vtc's, drawn from the output lengths of the VTC real trace in dir
// (a path relative to the repository, as sluice-bench fairness reads
// it).
func newSLOWorkload(name string, fixedTokens int, dir string) (sloWorkload, error) {
	switch name {
	case workloadFixed:
		return sloWorkload{name: name, lengths: []int{fixedTokens}, mean: float64(fixedTokens),
			source: fmt.Sprintf("every answer %d tokens (-max-tokens)", fixedTokens)}, nil
	case workloadVTC:
		path := vtc.Workloads["real"].Path(dir)
		lengths, err := vtcOutputLengths(path)
		if err != nil {
			return sloWorkload{}, fmt.Errorf("-workload vtc: %w (-dir names the directory of the VTC workloads)", err)
		}
		w := sloWorkload{name: name, lengths: lengths, mean: meanOf(lengths), directive: true}
		w.source = fmt.Sprintf("each answer's length drawn (seeded, uniformly) from the output_tokens column of %s (%d rows, %d–%d tokens, mean %.1f, median %g)",
			path, len(lengths), slices.Min(lengths), slices.Max(lengths), w.mean, median(floats(lengths)))
		return w, nil
	}
	return sloWorkload{}, fmt.Errorf("-workload: %q is neither %s nor %s", name, workloadFixed, workloadVTC)
}

// vtcOutputLengths is the output length of every row of a VTC workload.
func vtcOutputLengths(path string) ([]int, error) {
	rows, err := vtc.Load(path)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no rows", path)
	}
	out := make([]int, len(rows))
	for i, r := range rows {
		out[i] = r.Output
	}
	return out, nil
}

// lengthRNG is a step's generator of answer lengths: a stream of its
// own, so that the arrivals' times and tiers are the same whichever
// workload runs.
func lengthRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, ^seed)) }

// draw is the next arrival's answer length.
func (w sloWorkload) draw(rng *rand.Rand) int {
	if len(w.lengths) == 1 {
		return w.lengths[0]
	}
	return w.lengths[rng.IntN(len(w.lengths))]
}

// meanTokens is the mean answer rounded: the length the capacity is
// measured with. A batch's decode time is linear in the tokens it
// decodes, so answers all of the mean length take as long per answer as
// the mix, and a closed loop of equal answers has no long ones cut off
// by its window to bias it.
func (w sloWorkload) meanTokens() int { return max(1, int(math.Round(w.mean))) }

func meanOf(xs []int) float64 {
	sum := 0
	for _, x := range xs {
		sum += x
	}
	return float64(sum) / float64(len(xs))
}

func floats(xs []int) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// median is the middle of xs (the mean of the two middle ones when
// their number is even); NaN when there are none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// query is the query Sluice is sent for an answer of tokens: with the
// answer-length directive in front when the lengths vary.
func (w sloWorkload) query(q string, tokens int) string {
	if !w.directive {
		return q
	}
	return llmsim.AnswerTokensDirective(tokens) + q
}

// messages is the prompt sent straight to the simulator for an answer of
// tokens: its last message, the query, with the directive in front when
// the lengths vary (msgs is not changed).
func (w sloWorkload) messages(msgs []openai.Message, tokens int) []openai.Message {
	if !w.directive || len(msgs) == 0 {
		return msgs
	}
	out := slices.Clone(msgs)
	last := &out[len(out)-1]
	var text string
	if json.Unmarshal(last.Content, &text) == nil {
		*last = openai.TextMessage(last.Role, w.query(text, tokens))
	}
	return out
}
