package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// A row's message, once the simulator strips its directive, counts as
// the row's prompt tokens (the chat framing alone below it) and asks for
// the row's output.
func TestPromptWriterIsExact(t *testing.T) {
	w, err := newPromptWriter(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{0, 1, w.framing, w.framing + 1, 100, 511, 512, 513, 1021} {
		msg, got := w.message(fairRow{prompt: p, output: 77})
		text, n := llmsim.StripAnswerTokens(msg)
		counted := w.counter.CountChat([]tokens.Message{{Role: "user", Content: text}})
		if n != 77 || counted != got || got != max(p, w.framing) {
			t.Errorf("prompt %d: directive %d, counted %d, reported %d; want 77, %d", p, n, counted, got, max(p, w.framing))
		}
	}
}

// The sized simulator's capacity for the workload, by the same model,
// is the capacity asked for.
func TestSizeSimulator(t *testing.T) {
	rows := []fairRow{{arrival: 0, prompt: 256, output: 256}, {arrival: 100, prompt: 100, output: 50}}
	s := sizeSimulator(rows, 20, 500)
	step := (s.decodeBase + 20*s.decodePerSeq).Seconds()
	busy := 306*step/20 + 356*s.prefill.Seconds()
	if got := 662 / busy; math.Abs(got-500) > 0.5 {
		t.Errorf("capacity %v, want 500", got)
	}
	if math.Abs(s.offered-6.62) > 1e-9 || math.Abs(s.load-6.62/500) > 1e-9 {
		t.Errorf("offered %v (want 6.62), load %v", s.offered, s.load)
	}
}

// The shared workloads, when present, load whole.
func TestLoadSharedWorkloads(t *testing.T) {
	for _, w := range fairWorkloads {
		path := workloadPath(filepath.Join("..", "..", "..", "..", defaultWorkloadDir), w)
		if _, err := os.Stat(path); err != nil {
			t.Skipf("no %s: %v", path, err)
		}
		rows, err := loadWorkload(path)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]int{"overload": 2700, "real": 1500}[w.name]; len(rows) != want {
			t.Errorf("%s: %d rows, want %d", w.name, len(rows), want)
		}
	}
}
