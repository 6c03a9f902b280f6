package retrieval_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Load the built-in corpus, embed it with the local embedder and ask it a
// question.
func ExampleHybrid() {
	ctx := context.Background()
	emb := embed.NewLocal(embed.LocalOptions{})
	docs, err := retrieval.Builtin("sluice-docs")
	if err != nil {
		panic(err)
	}
	kb, err := retrieval.NewKB(ctx, "sluice-docs", docs, retrieval.KBOptions{
		Embedder: emb,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	h, err := retrieval.NewHybrid(retrieval.HybridOptions{}, kb)
	if err != nil {
		panic(err)
	}

	question := "How does a token bucket refill?"
	vecs, err := emb.Embed(ctx, []string{question})
	if err != nil {
		panic(err)
	}
	res, err := h.Retrieve(ctx, retrieval.Query{KB: "sluice-docs", Text: question, Vector: vecs[0], K: 2})
	if err != nil {
		panic(err)
	}
	for _, c := range res.Chunks {
		fmt.Println(c.DocID, "-", c.Title)
	}
	// Output:
	// token-bucket - Token bucket rate limiting
	// token-bucket - Token bucket rate limiting
}
