package rerank_test

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/rerank"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

func ExampleLexical() {
	candidates := []retrieval.Chunk{
		{ID: "queues#0", Text: "Queues hold requests while workers are busy.", Score: 0.9},
		{ID: "sse#1", Text: "EventSource reconnects and sends Last-Event-ID.", Score: 0.7},
		{ID: "bucket#1", Text: "Refill is computed lazily on each request.", Score: 0.6},
	}
	r := rerank.NewLexical(rerank.LexicalOptions{})
	top, err := r.Rerank(context.Background(), "when does the bucket refill", candidates, 2)
	if err != nil {
		panic(err)
	}
	for _, c := range top {
		fmt.Printf("%s %.2f\n", c.ID, c.Score)
	}
	// Output:
	// bucket#1 0.83
	// queues#0 0.50
}
