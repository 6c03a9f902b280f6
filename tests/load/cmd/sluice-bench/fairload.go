package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// The fairness scenario's inputs: the VTC paper's workloads (one CSV
// row a request, ../shared/workloads/README.md), the paper's numbers to
// compare with, the simulator sized to each workload, and each row's
// prompt written to its recorded length.

// fairRow is one request of a workload.
type fairRow struct {
	arrival        float64
	client         string
	prompt, output int
}

// paperRow is one scheduler's published result on a workload (accDiff
// < 0: not published).
type paperRow struct {
	scheduler                             string
	accDiff, maxDiff, avgDiff, throughput float64
}

// fairWorkload is a workload the scenario knows: its file and the
// paper's results on it, FCFS first.
type fairWorkload struct {
	name, file string
	paper      []paperRow
}

// fairWorkloads are the artifact's results as ../shared/workloads/README.md
// quotes them (recomputed there with the artifact's definitions).
var fairWorkloads = map[string]fairWorkload{
	"overload": {name: "overload", file: "vtc-overload.csv", paper: []paperRow{
		{"FCFS", 237738, 447.4, 439.0, 876},
		{"VTC (output length unknown)", 8101, 192.9, 103.8, 893},
		{"VTC, output length known", 253, 5.9, 0.5, 895},
	}},
	"real": {name: "real", file: "vtc-real.csv", paper: []paperRow{
		{"FCFS", -1, 760.0, 433.5, 777},
		{"VTC", -1, 368.4, 251.7, 779},
		{"VTC, output length known", -1, 329.5, 227.5, 781},
		{"requests-per-minute limit 5", -1, 143.9, 83.6, 340},
	}},
}

// loadWorkload reads a workload's CSV: arrival_s, client, prompt_tokens,
// output_tokens; rows sorted by arrival.
func loadWorkload(path string) ([]fairRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if strings.Join(head, ",") != "arrival_s,client,prompt_tokens,output_tokens" {
		return nil, fmt.Errorf("%s: header %q, want arrival_s,client,prompt_tokens,output_tokens", path, head)
	}
	var rows []fairRow
	for line := 2; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		at, err1 := strconv.ParseFloat(rec[0], 64)
		p, err2 := strconv.Atoi(rec[2])
		o, err3 := strconv.Atoi(rec[3])
		if err := errors.Join(err1, err2, err3); err != nil || at < 0 || p < 0 || o < 1 || rec[1] == "" {
			return nil, fmt.Errorf("%s:%d: bad row %q", path, line, rec)
		}
		rows = append(rows, fairRow{arrival: at, client: rec[1], prompt: p, output: o})
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].arrival < rows[j].arrival })
	return rows, nil
}

// workloadPath is the workload's file under dir.
func workloadPath(dir string, w fairWorkload) string { return filepath.Join(dir, w.file) }

// simSizing is the simulator a workload runs on: the batch Sluice's
// permits fill, its step costs stretched by factor from llmsim's
// defaults so that its capacity for the workload is the paper's FCFS
// throughput, and the offered load as a multiple of that capacity.
type simSizing struct {
	batch                               int
	factor                              float64
	decodeBase, decodePerSeq, prefill   time.Duration
	offered, defaultCapacity, capacity  float64
	load                                float64
	promptTokens, outputTokens, seconds float64
}

// sizeSimulator sizes the simulator for rows to serve capacity
// (prompt + output) tokens per trace second at a full batch. With B
// sequences running, a step of llmsim takes base + B × per-seq and gives
// every sequence a token, and a prompt costs prefill per token in the
// step that admits it; so serving the workload takes
// Σoutput × step / B + Σprompt × prefill.
func sizeSimulator(rows []fairRow, batch int, capacity float64) simSizing {
	d := llmsim.DefaultConfig()
	s := simSizing{batch: batch, capacity: capacity}
	for _, r := range rows {
		s.promptTokens += float64(r.prompt)
		s.outputTokens += float64(r.output)
		s.seconds = max(s.seconds, r.arrival)
	}
	step := (d.DecodeBase + time.Duration(batch)*d.DecodePerSeq).Seconds()
	busy := s.outputTokens*step/float64(batch) + s.promptTokens*d.PrefillPerToken.Seconds()
	s.defaultCapacity = (s.promptTokens + s.outputTokens) / busy
	s.factor = s.defaultCapacity / capacity
	stretch := func(x time.Duration) time.Duration { return time.Duration(float64(x) * s.factor) }
	s.decodeBase, s.decodePerSeq, s.prefill = stretch(d.DecodeBase), stretch(d.DecodePerSeq), stretch(d.PrefillPerToken)
	// The trace's own span (600 s for both): its arrivals over it.
	s.offered = (s.promptTokens + s.outputTokens) / max(s.seconds, 1)
	s.load = s.offered / capacity
	return s
}

// apply sets the simulator's batch and step costs, in trace seconds,
// and runs it speed times faster than the trace. The KV cache holds a
// full batch of the longest requests, so that the batch, not memory,
// bounds it, as Sluice's permits assume.
func (s simSizing) apply(sim *llmsim.Config, speed float64) {
	sim.MaxNumSeqs = s.batch
	sim.KVCacheBlocks = 4096
	sim.DecodeBase, sim.DecodePerSeq, sim.PrefillPerToken = s.decodeBase, s.decodePerSeq, s.prefill
	sim.TimeScale = 1 / speed
}

// promptWriter writes prompts of a given token count as the simulator
// counts them (tiktoken plus OpenAI's chat framing, pkg/tokens).
type promptWriter struct {
	counter *tokens.Counter
	// framing is what one user message costs with no text.
	framing int
	words   []string
}

// fillerWords are words that are one cl100k token alone and after a
// space, so that n of them are n tokens.
var fillerWords = strings.Fields("the fair queue serves every client its share of tokens while the batch runs and " +
	"each request waits for a permit from the pool before it reaches the model which decodes one word at a time")

func newPromptWriter(encoding string) (*promptWriter, error) {
	c, err := tokens.For(encoding)
	if err != nil {
		return nil, err
	}
	w := &promptWriter{counter: c, framing: c.CountChat([]tokens.Message{{Role: "user"}})}
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

// text is a user message the simulator counts as target prompt tokens,
// and the count it gets: the framing alone when target is below it.
func (w *promptWriter) text(target int) (string, int) {
	n := max(target-w.framing, 0)
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(w.words[i%len(w.words)])
	}
	s := b.String()
	return s, w.framing + w.counter.Count(s)
}

// message is the user message of a row: the simulator's answer-length
// directive, then the prompt; and the prompt tokens the simulator counts
// (the directive is removed before it counts).
func (w *promptWriter) message(r fairRow) (string, int) {
	text, got := w.text(r.prompt)
	return llmsim.AnswerTokensDirective(r.output) + text, got
}
