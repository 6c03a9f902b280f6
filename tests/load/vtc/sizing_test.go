package vtc

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
	w, err := NewPromptWriter(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{0, 1, w.Framing, w.Framing + 1, 100, 511, 512, 513, 1021} {
		msg, got := w.Message(Row{Prompt: p, Output: 77})
		text, n := llmsim.StripAnswerTokens(msg)
		counted := w.Counter.CountChat([]tokens.Message{{Role: "user", Content: text}})
		if n != 77 || counted != got || got != max(p, w.Framing) {
			t.Errorf("prompt %d: directive %d, counted %d, reported %d; want 77, %d", p, n, counted, got, max(p, w.Framing))
		}
	}
}

// The sized simulator's capacity for the workload, by the same model,
// is the capacity asked for.
func TestSizeSimulator(t *testing.T) {
	rows := []Row{{Arrival: 0, Prompt: 256, Output: 256}, {Arrival: 100, Prompt: 100, Output: 50}}
	s := SizeSimulator(rows, 20, 500)
	step := (s.DecodeBase + 20*s.DecodePerSeq).Seconds()
	busy := 306*step/20 + 356*s.Prefill.Seconds()
	if got := 662 / busy; math.Abs(got-500) > 0.5 {
		t.Errorf("capacity %v, want 500", got)
	}
	if math.Abs(s.Offered-6.62) > 1e-9 || math.Abs(s.Load-6.62/500) > 1e-9 {
		t.Errorf("offered %v (want 6.62), load %v", s.Offered, s.Load)
	}
}

// The shared workloads, when present, load whole.
func TestLoadSharedWorkloads(t *testing.T) {
	for _, w := range Workloads {
		path := w.Path(filepath.Join("..", "..", "..", DefaultDir))
		if _, err := os.Stat(path); err != nil {
			t.Skipf("no %s: %v", path, err)
		}
		rows, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]int{"overload": 2700, "real": 1500}[w.Name]; len(rows) != want {
			t.Errorf("%s: %d rows, want %d", w.Name, len(rows), want)
		}
	}
}
