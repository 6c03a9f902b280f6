package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// syntheticDocs are n documents of one chunk each, of distinct words.
func syntheticDocs(n int, salt string) []ingest.Document {
	docs := make([]ingest.Document, n)
	for i := range docs {
		var sb strings.Builder
		for w := range 60 {
			fmt.Fprintf(&sb, "w%d ", (i*7919+w*104729)%50000)
		}
		docs[i] = ingest.Document{ID: fmt.Sprint("d", i), Title: fmt.Sprint("doc ", i, salt), Text: sb.String()}
	}
	return docs
}

// BenchmarkLive: ingestion throughput (chunks/s), a query against a live
// kb of 10k chunks, and catching up after one document changed (read the
// change, rebuild the index from memory).
func BenchmarkLive(b *testing.B) {
	const n = 10000
	ctx := context.Background()
	f2 := newFixture(b)
	docs := syntheticDocs(n, "")
	start := time.Now()
	for lo := 0; lo < n; lo += 100 {
		if _, err := f2.ing.Put(ctx, "big", docs[lo:lo+100]); err != nil {
			b.Fatal(err)
		}
	}
	took := time.Since(start)
	b.Logf("ingested %d chunks (batches of 100 documents, local embedder) in %v: %.0f chunks/s", n, took.Round(time.Millisecond), float64(n)/took.Seconds())
	vec, _ := f2.emb.Embed(ctx, []string{"w17 w4242 w999"})
	q := retrieval.Query{KB: "big", Text: "w17 w4242 w999", Vector: vec[0], K: 10}
	if _, err := f2.live.Retrieve(ctx, q); err != nil { // first load
		b.Fatal(err)
	}
	b.Run("retrieve-10k", func(b *testing.B) {
		for b.Loop() {
			if _, err := f2.live.Retrieve(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("catch-up-one-change-10k", func(b *testing.B) {
		i := 0
		for b.Loop() {
			b.StopTimer()
			i++
			d := syntheticDocs(1, fmt.Sprint(" v", i))
			if _, err := f2.ing.Put(ctx, "big", d); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := f2.live.Retrieve(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	})
}
