package prompt

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

func newBuilder(t testing.TB) *Builder {
	c, err := tokens.For(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	return NewBuilder("You are a helpful assistant. Answer from the context.", c)
}

func TestMessagesCarryContextAndQuery(t *testing.T) {
	b := newBuilder(t)
	msgs := b.Messages([]retrieval.Chunk{{Title: "Token buckets", Text: "A bucket refills at a fixed rate."}, {Text: "Second."}}, "how?")
	if len(msgs) != 2 || msgs[0].Role != "system" || msgs[1].Role != "user" || text(msgs[1]) != "how?" {
		t.Fatalf("messages %+v", msgs)
	}
	want := "You are a helpful assistant. Answer from the context.\n\nContext:\n[1] Token buckets\nA bucket refills at a fixed rate.\n\n[2] Second."
	if text(msgs[0]) != want {
		t.Fatalf("system message %q", text(msgs[0]))
	}
}

// Bound must never be below the exact count, or a prompt could be sent to
// a pool it does not fit; and it should stay close, or routing wastes the
// long pool.
func TestBoundIsAnUpperBound(t *testing.T) {
	b := newBuilder(t)
	docs, err := retrieval.Builtin("sluice-docs")
	if err != nil {
		t.Fatal(err)
	}
	queries := []string{"How does a token bucket refill?", "what is P99/P50?", "日本語の質問です", "  spaces   and\ttabs\n", "x"}
	for qi, q := range queries {
		for i := 0; i+3 <= len(docs); i += 3 {
			var chunks []retrieval.Chunk
			for _, d := range docs[i : i+3] {
				text := d.Text
				if len(text) > 600 {
					text = text[:600]
				}
				chunks = append(chunks, retrieval.Chunk{Title: d.Title, Text: text})
			}
			exact := b.Count(b.Messages(chunks, q))
			bound := b.Bound(chunks, q)
			if bound < exact {
				t.Fatalf("query %d docs %d: bound %d < exact %d", qi, i, bound, exact)
			}
			if bound > exact+60 {
				t.Errorf("query %d docs %d: bound %d is far above exact %d", qi, i, bound, exact)
			}
		}
	}
}

func TestBoundBeforeRetrievalCoversAnyChunks(t *testing.T) {
	b := newBuilder(t)
	c, _ := tokens.For(tokens.CL100K)
	chunk := strings.Repeat("word ", 100)
	if n := c.Count(chunk); n > 120 {
		t.Fatalf("test chunk has %d tokens", n)
	}
	var chunks []retrieval.Chunk
	for i := 0; i < 3; i++ {
		chunks = append(chunks, retrieval.Chunk{Text: chunk, Title: fmt.Sprintf("T%d", i)})
	}
	exact := b.Count(b.Messages(chunks, "q"))
	if bound := b.BoundBeforeRetrieval("q", 3, 120); bound < exact {
		t.Fatalf("bound before retrieval %d < exact %d", bound, exact)
	}
}

func BenchmarkBound(b *testing.B) {
	bl := newBuilder(b)
	chunks := []retrieval.Chunk{{Text: strings.Repeat("alpha beta ", 50)}, {Text: strings.Repeat("gamma delta ", 50)}}
	b.Run("bound", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			bl.Bound(chunks, "how does it work")
		}
	})
	b.Run("exact", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			bl.Count(bl.Messages(chunks, "how does it work"))
		}
	})
}

func TestHistoryFitsItsBudgetNewestFirst(t *testing.T) {
	b := newBuilder(t)
	var history []Exchange
	for i := range 10 {
		history = append(history, Exchange{
			User:      fmt.Sprintf("question %d about token buckets and queues?", i),
			Assistant: strings.Repeat(fmt.Sprintf("answer %d ", i), 10),
		})
	}
	one := b.ExchangeTokens(history[9])
	for _, budget := range []int{0, one - 1, one, 3*one + 1, 1 << 20} {
		kept, used := b.FitHistory(history, budget)
		if used > budget {
			t.Fatalf("budget %d: used %d", budget, used)
		}
		if len(kept) > 0 && kept[len(kept)-1] != history[9] {
			t.Fatalf("budget %d: the newest exchange is not kept", budget)
		}
		// The bound covers the exact count of the prompt with history.
		chunks := []retrieval.Chunk{{Title: "T", Text: "Some context."}}
		exact := b.Count(b.Conversation(kept, chunks, "and now?"))
		if bound := b.Bound(chunks, "and now?") + used; bound < exact {
			t.Fatalf("budget %d: bound %d < exact %d", budget, bound, exact)
		}
	}
	if kept, _ := b.FitHistory(history, one-1); len(kept) != 0 {
		t.Fatalf("kept %d exchanges under a budget smaller than one", len(kept))
	}
	if kept, _ := b.FitHistory(history, 3*one+1); len(kept) != 3 {
		t.Fatalf("kept %d exchanges, want 3", len(kept))
	}
	msgs := b.Conversation(history[8:], nil, "q")
	if len(msgs) != 6 || msgs[1].Role != "user" || msgs[2].Role != "assistant" || text(msgs[5]) != "q" {
		t.Fatalf("conversation %+v", msgs)
	}
}

func text(m openai.Message) string {
	s, err := m.Text()
	if err != nil {
		panic(err)
	}
	return s
}

// A client's conversation follows the context, whole and in order.
func TestAround(t *testing.T) {
	b := newBuilder(t)
	conv := []openai.Message{openai.TextMessage("system", "Be terse."), openai.TextMessage("user", "a"),
		openai.TextMessage("assistant", "b"), openai.TextMessage("user", "c")}
	msgs := b.Around([]retrieval.Chunk{{Text: "fact"}}, conv)
	if len(msgs) != 5 || msgs[0].Role != "system" || !strings.Contains(text(msgs[0]), "[1] fact") || text(msgs[1]) != "Be terse." || text(msgs[4]) != "c" {
		t.Fatalf("prompt %+v", msgs)
	}
	if n := b.Count(msgs); n <= b.Count(msgs[:1]) {
		t.Fatalf("count %d does not grow with the conversation", n)
	}
}
