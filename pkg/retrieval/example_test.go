package retrieval_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Ingest the built-in corpus into a kb store, embedded with the local
// embedder, and ask it a question through Live. In a worker, a
// CachedRetriever sits in front of the Live.
func ExampleLive() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testRedis.Addr})
	defer rdb.Close()
	store := kbstore.New(rdb, kbstore.Options{Prefix: "example-live:"})
	emb := embed.NewLocal(embed.LocalOptions{})
	builtin, err := retrieval.Builtin("sluice-docs")
	if err != nil {
		panic(err)
	}
	docs := make([]ingest.Document, len(builtin))
	for i, d := range builtin {
		docs[i] = ingest.Document{ID: d.ID, Title: d.Title, Text: d.Text}
	}
	ing := &ingest.Ingester{Store: store, Embedder: emb}
	if _, err := ing.Put(ctx, "sluice-docs", docs); err != nil {
		panic(err)
	}
	live, err := retrieval.NewLive(store, retrieval.LiveOptions{
		Model:  emb.Model(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}

	question := "How does a token bucket refill?"
	vecs, err := emb.Embed(ctx, []string{question})
	if err != nil {
		panic(err)
	}
	res, err := live.Retrieve(ctx, retrieval.Query{KB: "sluice-docs", Text: question, Vector: vecs[0], K: 2})
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
