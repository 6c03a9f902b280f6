package rerank

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/sluice-dev/sluice/pkg/retrieval"
)

func ids(chunks []retrieval.Chunk) []string {
	var out []string
	for _, c := range chunks {
		out = append(out, c.ID)
	}
	return out
}

func TestLexicalMovesMatchingCandidateUp(t *testing.T) {
	in := []retrieval.Chunk{
		{ID: "a", Title: "Queues", Text: "Queues hold requests while workers are busy.", Score: 0.9},
		{ID: "b", Title: "Limits", Text: "Limits protect the backend from overload.", Score: 0.8},
		{ID: "c", Title: "Token bucket", Text: "A token bucket refills at a steady rate up to its capacity.", Score: 0.6},
		{ID: "d", Title: "Backoff", Text: "Clients back off exponentially after failures.", Score: 0.5},
	}
	original := slices.Clone(in)
	out, err := NewLexical(LexicalOptions{}).Rerank(context.Background(), "How does a token bucket refill?", in, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(out); !slices.Equal(got, []string{"c", "a", "b"}) {
		t.Errorf("order = %v, want c first, then the rest by retrieval score", got)
	}
	if out[0].Score <= out[1].Score || out[0].Score > 1 {
		t.Errorf("scores = %v", out)
	}
	if !slices.Equal(in, original) {
		t.Error("Rerank modified its input")
	}
}

func TestLexicalFusesRetrievalScore(t *testing.T) {
	in := []retrieval.Chunk{
		{ID: "weak-match", Text: "redis", Score: 0.0},
		{ID: "strong-retrieval", Text: "streams of events", Score: 1.0},
	}
	ctx := context.Background()
	// Lexical weight 0.5: "redis" gives weak-match the full lexical half,
	// strong-retrieval has the full retrieval half: a tie, kept in input order.
	out, _ := NewLexical(LexicalOptions{}).Rerank(ctx, "redis", in, 0)
	if got := ids(out); !slices.Equal(got, []string{"weak-match", "strong-retrieval"}) || out[0].Score != out[1].Score {
		t.Errorf("even weights: %v", out)
	}
	// Weight 0.2 leaves retrieval in charge.
	out, _ = NewLexical(LexicalOptions{Weight: 0.2}).Rerank(ctx, "redis", in, 0)
	if got := ids(out); got[0] != "strong-retrieval" {
		t.Errorf("weight 0.2: %v", got)
	}
}

func TestLexicalKAndTies(t *testing.T) {
	var in []retrieval.Chunk
	for i := range 10 {
		in = append(in, retrieval.Chunk{ID: fmt.Sprint(i), Text: "same text", Score: 1})
	}
	r := NewLexical(LexicalOptions{})
	ctx := context.Background()
	out, err := r.Rerank(ctx, "same", in, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(out); !slices.Equal(got, []string{"0", "1", "2", "3"}) {
		t.Errorf("ties: %v, want input order cut to k=4", got)
	}
	for _, k := range []int{0, -1, 100} {
		if out, _ := r.Rerank(ctx, "same", in, k); len(out) != 10 {
			t.Errorf("k=%d: %d chunks, want all 10", k, len(out))
		}
	}
	if out, err := r.Rerank(ctx, "x", nil, 3); err != nil || out == nil || len(out) != 0 {
		t.Errorf("no candidates: %v, %v", out, err)
	}
	// A query with no terms at all keeps the retrieval order.
	in[3].Score = 2
	if out, _ := r.Rerank(ctx, "the of", in, 2); !slices.Equal(ids(out), []string{"3", "0"}) {
		t.Errorf("no query terms: %v", ids(out))
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Rerank(cancelled, "same", in, 2); err == nil {
		t.Error("cancelled context accepted")
	}
}

func TestLexicalVersion(t *testing.T) {
	if v := NewLexical(LexicalOptions{}).Version(); v != "lexical-v1/w0.5/k1=1.2/b=0.75" {
		t.Errorf("Version() = %q", v)
	}
	if NewLexical(LexicalOptions{Weight: 0.3}).Version() == NewLexical(LexicalOptions{}).Version() {
		t.Error("Version ignores the weight")
	}
}

func BenchmarkLexicalRerank(b *testing.B) {
	words := []string{"token", "bucket", "refill", "rate", "limit", "queue", "tenant", "redis", "stream", "latency",
		"batch", "cache", "the", "a", "of", "requests", "server", "client", "burst", "capacity"}
	in := make([]retrieval.Chunk, 20)
	for i := range in {
		text := ""
		for j := range 90 {
			text += words[(i*7+j*13)%len(words)] + " "
		}
		in[i] = retrieval.Chunk{ID: fmt.Sprint(i), Title: "Doc " + fmt.Sprint(i), Text: text, Score: float64(20-i) / 20}
	}
	r := NewLexical(LexicalOptions{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Rerank(ctx, "how does a token bucket refill under burst", in, 3); err != nil {
			b.Fatal(err)
		}
	}
}

func TestLexicalNegativeRetrievalScores(t *testing.T) {
	in := []retrieval.Chunk{
		{ID: "a", Text: "alpha", Score: -1},
		{ID: "b", Text: "beta", Score: -3},
		{ID: "c", Text: "gamma", Score: -2},
	}
	out, err := NewLexical(LexicalOptions{}).Rerank(context.Background(), "nothing matches", in, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(out); !slices.Equal(got, []string{"a", "c", "b"}) || out[0].Score != 0.5 || out[2].Score != 0 {
		t.Errorf("negative scores: %v", out)
	}
}
