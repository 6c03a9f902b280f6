package embed_test

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Local is no language model, but on the built-in corpus a question must
// land on the document about its topic, by cosine similarity alone.
func TestLocalRanksBuiltinCorpus(t *testing.T) {
	docs, err := retrieval.Builtin("sluice-docs")
	if err != nil {
		t.Fatal(err)
	}
	l := embed.NewLocal(embed.LocalOptions{})
	texts := make([]string, len(docs))
	for i, d := range docs {
		texts[i] = d.Title + "\n\n" + d.Text
	}
	vecs, err := l.Embed(context.Background(), texts)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ question, doc string }{
		{"how does a token bucket refill", "token-bucket"},
		{"weighted fair queuing between tenants", "weighted-fair-queuing"},
		{"redis streams consumer groups", "redis-streams"},
		{"continuous batching throughput", "continuous-batching"},
		{"what is an idempotency key", "idempotency"},
		{"server-sent events reconnect", "server-sent-events"},
		{"count tokens with tiktoken", "tiktoken"},
		{"P99 tail latency percentiles", "tail-latency"},
	}
	for _, tc := range cases {
		q := embedOne(t, l, tc.question)
		best, bestScore, want := "", -2.0, -2.0
		for i, d := range docs {
			s := dot(q, vecs[i])
			if s > bestScore {
				best, bestScore = d.ID, s
			}
			if d.ID == tc.doc {
				want = s
			}
		}
		if best != tc.doc {
			t.Errorf("%q: nearest document %s (%.3f), want %s (%.3f)", tc.question, best, bestScore, tc.doc, want)
		}
	}
}

func dot(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}
