package vtc

import (
	"errors"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Sizing is the simulator a workload runs on: the batch Sluice's
// permits fill, its step costs stretched by Factor from llmsim's
// defaults so that its capacity for the workload is the paper's FCFS
// throughput, and the offered load as a multiple of that capacity.
type Sizing struct {
	Batch                               int
	Factor                              float64
	DecodeBase, DecodePerSeq, Prefill   time.Duration
	Offered, DefaultCapacity, Capacity  float64
	Load                                float64
	PromptTokens, OutputTokens, Seconds float64
}

// SizeSimulator sizes the simulator for rows to serve capacity
// (prompt + output) tokens per trace second at a full batch. With B
// sequences running, a step of llmsim takes base + B × per-seq and gives
// every sequence a token, and a prompt costs prefill per token in the
// step that admits it; so serving the workload takes
// Σoutput × step / B + Σprompt × prefill.
func SizeSimulator(rows []Row, batch int, capacity float64) Sizing {
	d := llmsim.DefaultConfig()
	s := Sizing{Batch: batch, Capacity: capacity}
	for _, r := range rows {
		s.PromptTokens += float64(r.Prompt)
		s.OutputTokens += float64(r.Output)
		s.Seconds = max(s.Seconds, r.Arrival)
	}
	step := (d.DecodeBase + time.Duration(batch)*d.DecodePerSeq).Seconds()
	busy := s.OutputTokens*step/float64(batch) + s.PromptTokens*d.PrefillPerToken.Seconds()
	s.DefaultCapacity = (s.PromptTokens + s.OutputTokens) / busy
	s.Factor = s.DefaultCapacity / capacity
	stretch := func(x time.Duration) time.Duration { return time.Duration(float64(x) * s.Factor) }
	s.DecodeBase, s.DecodePerSeq, s.Prefill = stretch(d.DecodeBase), stretch(d.DecodePerSeq), stretch(d.PrefillPerToken)
	// The trace's own span (600 s for both): its arrivals over it.
	s.Offered = (s.PromptTokens + s.OutputTokens) / max(s.Seconds, 1)
	s.Load = s.Offered / capacity
	return s
}

// Apply sets the simulator's batch and step costs, in trace seconds,
// and runs it speed times faster than the trace. The KV cache holds a
// full batch of the longest requests, so that the batch, not memory,
// bounds it, as Sluice's permits assume.
func (s Sizing) Apply(sim *llmsim.Config, speed float64) {
	sim.MaxNumSeqs = s.Batch
	// A request without max_tokens (MaxTokensOmitted) must get its
	// recorded length, as Sluice's raised default gives it.
	sim.DefaultMaxTokens = max(sim.DefaultMaxTokens, OmittedBudget)
	sim.KVCacheBlocks = 4096
	sim.DecodeBase, sim.DecodePerSeq, sim.PrefillPerToken = s.DecodeBase, s.DecodePerSeq, s.Prefill
	sim.TimeScale = 1 / speed
}

// PromptWriter writes prompts of a given token count as the simulator
// counts them (tiktoken plus OpenAI's chat framing, pkg/tokens).
type PromptWriter struct {
	Counter *tokens.Counter
	// Framing is what one user message costs with no text.
	Framing int
	words   []string
}

// fillerWords are words that are one cl100k token alone and after a
// space, so that n of them are n tokens.
var fillerWords = strings.Fields("the fair queue serves every client its share of tokens while the batch runs and " +
	"each request waits for a permit from the pool before it reaches the model which decodes one word at a time")

// NewPromptWriter writes prompts counted with encoding.
func NewPromptWriter(encoding string) (*PromptWriter, error) {
	c, err := tokens.For(encoding)
	if err != nil {
		return nil, err
	}
	w := &PromptWriter{Counter: c, Framing: c.CountChat([]tokens.Message{{Role: "user"}})}
	for _, word := range fillerWords {
		if c.Count(word) == 1 && c.Count(" "+word) == 1 {
			w.words = append(w.words, word)
		}
	}
	if len(w.words) == 0 {
		return nil, errors.New("no one-token filler words in " + encoding)
	}
	return w, nil
}

// Text is a user message the simulator counts as target prompt tokens,
// and the count it gets: the framing alone when target is below it.
func (w *PromptWriter) Text(target int) (string, int) {
	n := max(target-w.Framing, 0)
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(w.words[i%len(w.words)])
	}
	s := b.String()
	return s, w.Framing + w.Counter.Count(s)
}

// Message is the user message of a row: the simulator's answer-length
// directive, then the prompt; and the prompt tokens the simulator counts
// (the directive is removed before it counts).
func (w *PromptWriter) Message(r Row) (string, int) {
	text, got := w.Text(r.Prompt)
	return llmsim.AnswerTokensDirective(r.Output) + text, got
}
