package llmsim_test

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/pkg/llmsim"
)

// The answer-length directive sets how long the answer is, whatever
// length the hash would draw, costs no prompt tokens, and max_tokens
// still cuts it.
func TestAnswerTokensDirective(t *testing.T) {
	sim := start(t, testConfig())
	ctx := context.Background()
	plain, err := sim.streamChat(ctx, map[string]any{"messages": userMsg("Explain preemption."), "max_tokens": 2000})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		n, maxTokens, want int
		finish             string
	}{{n: 300, maxTokens: 2000, want: 300, finish: "stop"}, {n: 3, maxTokens: 2000, want: 3, finish: "stop"},
		{n: 300, maxTokens: 300, want: 300, finish: "length"}, {n: 300, maxTokens: 50, want: 50, finish: "length"}} {
		msg := llmsim.AnswerTokensDirective(c.n) + "Explain preemption."
		res, err := sim.streamChat(ctx, map[string]any{"messages": userMsg(msg), "max_tokens": c.maxTokens})
		if err != nil {
			t.Fatal(err)
		}
		if res.Finish != c.finish || res.Chunks != c.want || res.Usage.CompletionTokens != c.want {
			t.Errorf("n=%d max_tokens=%d: finish %q, %d chunks, usage %+v; want %s, %d", c.n, c.maxTokens, res.Finish, res.Chunks, res.Usage, c.finish, c.want)
		}
		if res.Usage.PromptTokens != plain.Usage.PromptTokens {
			t.Errorf("n=%d: prompt tokens %d, want %d as without the directive", c.n, res.Usage.PromptTokens, plain.Usage.PromptTokens)
		}
	}
}

func TestStripAnswerTokens(t *testing.T) {
	for _, c := range []struct {
		in, rest string
		n        int
	}{
		{"[llmsim answer_tokens=12] hello", "hello", 12},
		{"[llmsim answer_tokens=12]\nhello", "hello", 12},
		{"[llmsim answer_tokens=12]", "", 12},
		{"[llmsim answer_tokens=12]x", "x", 12},
		// Not directives: kept whole, as text.
		{"hello [llmsim answer_tokens=12]", "hello [llmsim answer_tokens=12]", 0},
		{"[llmsim answer_tokens=0] hi", "[llmsim answer_tokens=0] hi", 0},
		{"[llmsim answer_tokens=+5] hi", "[llmsim answer_tokens=+5] hi", 0},
		{"[llmsim answer_tokens=99999999] hi", "[llmsim answer_tokens=99999999] hi", 0},
		{"[llmsim answer_tokens=7 hi", "[llmsim answer_tokens=7 hi", 0},
	} {
		rest, n := llmsim.StripAnswerTokens(c.in)
		if rest != c.rest || n != c.n {
			t.Errorf("StripAnswerTokens(%q) = %q, %d; want %q, %d", c.in, rest, n, c.rest, c.n)
		}
	}
}
