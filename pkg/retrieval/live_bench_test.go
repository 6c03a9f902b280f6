package retrieval_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// corpus makes documents of 60 words (one chunk each) drawn from a
// Zipf-distributed vocabulary of 20,000 pseudo-words, so that postings
// lists are skewed as in text: a few terms are in most chunks, most in
// few.
type corpus struct {
	rng   *rand.Rand
	vocab []string
	zipf  *rand.Zipf
}

func newCorpus(seed uint64) *corpus {
	rng := rand.New(rand.NewPCG(seed, 3))
	syllables := []string{"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "be", "fi", "ho", "ja"}
	vocab := make([]string, 20000)
	for i := range vocab {
		var b strings.Builder
		for range 2 + rng.IntN(3) {
			b.WriteString(syllables[rng.IntN(len(syllables))])
		}
		vocab[i] = b.String() + strconv.Itoa(i%10)
	}
	return &corpus{rng: rng, vocab: vocab, zipf: rand.NewZipf(rng, 1.1, 2, uint64(len(vocab)-1))}
}

func (c *corpus) doc(id, salt string) ingest.Document {
	words := make([]string, 60)
	for i := range words {
		words[i] = c.vocab[c.zipf.Uint64()]
	}
	return ingest.Document{ID: id, Title: words[0] + " " + words[1] + salt, Text: strings.Join(words, " ") + "."}
}

// queries are a fixed set of questions a user could ask: two to five
// words of one document, in its order, so that a query mixes frequent
// terms (long postings lists) with rarer ones, embedded beforehand.
func (c *corpus) queries(b *testing.B, kb string, docs []ingest.Document, n int) []retrieval.Query {
	emb := embed.NewLocal(embed.LocalOptions{})
	qs := make([]retrieval.Query, n)
	texts := make([]string, n)
	for i := range qs {
		words := strings.Fields(docs[c.rng.IntN(len(docs))].Text)
		at := c.rng.IntN(len(words) - 5)
		texts[i] = strings.Join(words[at:at+2+c.rng.IntN(4)], " ")
	}
	vecs, err := emb.Embed(context.Background(), texts)
	if err != nil {
		b.Fatal(err)
	}
	for i := range qs {
		qs[i] = retrieval.Query{KB: kb, Text: texts[i], Vector: vecs[i], K: 10}
	}
	return qs
}

// percentile of sorted durations, in milliseconds.
func percentile(sorted []time.Duration, p float64) float64 {
	i := min(int(p*float64(len(sorted))), len(sorted)-1)
	return float64(sorted[i].Microseconds()) / 1000
}

// BenchmarkLive measures, at 10k and 100k chunks: ingestion (chunk,
// embed with the local embedder, store) in chunks/s; query latency p50
// and p99 over a fixed set of 200 queries against the live kb (each
// reading the kb's version from Redis, as a request does); and catching
// up after one document changed, by patching the index and by rebuilding
// it, side by side. ns/op of the query benchmark is for the whole set.
func BenchmarkLive(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("chunks=%dk", n/1000), func(b *testing.B) { benchLive(b, n) })
	}
}

func benchLive(b *testing.B, n int) {
	ctx := context.Background()
	store := kbstore.New(testRedis.Client(b), kbstore.Options{Prefix: prefix(b)})
	emb := embed.NewLocal(embed.LocalOptions{})
	ing := &ingest.Ingester{Store: store, Embedder: emb}
	const kb = "big"
	c := newCorpus(1)
	docs := make([]ingest.Document, n)
	for i := range docs {
		docs[i] = c.doc("d"+strconv.Itoa(i), "")
	}
	start := time.Now()
	for lo := 0; lo < n; lo += 100 {
		if _, err := ing.Put(ctx, kb, docs[lo:lo+100]); err != nil {
			b.Fatal(err)
		}
	}
	took := time.Since(start)
	ingestRate := float64(n) / took.Seconds()
	b.Logf("ingested %d chunks in batches of 100 documents in %v: %.0f chunks/s", n, took.Round(time.Millisecond), ingestRate)

	newLive := func() *retrieval.Live {
		l, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: emb.Model(), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := l.Pin(ctx, kb); err != nil {
			b.Fatal(err)
		}
		b.Logf("first load of the live kb: %v", time.Since(start).Round(time.Millisecond))
		return l
	}
	live := newLive()
	qs := c.queries(b, kb, docs, 200)

	b.Run("query", func(b *testing.B) {
		var durs []time.Duration
		for b.Loop() {
			for _, q := range qs {
				t0 := time.Now()
				if _, err := live.Retrieve(ctx, q); err != nil {
					b.Fatal(err)
				}
				durs = append(durs, time.Since(t0))
			}
		}
		slices.Sort(durs)
		b.ReportMetric(ingestRate, "ingest-chunks/s")
		b.ReportMetric(percentile(durs, 0.5), "p50-ms")
		b.ReportMetric(percentile(durs, 0.99), "p99-ms")
	})

	// ns/op is a catch-up by patching. Rebuilding takes long enough that
	// it is timed on a fixed few changes, each paired with a patch.
	b.Run("catch-up-one-change", func(b *testing.B) {
		i := 0
		change := func() {
			i++
			d := c.doc("d"+strconv.Itoa(c.rng.IntN(n)), " v"+strconv.Itoa(i))
			if _, err := ing.Put(ctx, kb, []ingest.Document{d}); err != nil {
				b.Fatal(err)
			}
		}
		pin := func(l *retrieval.Live) time.Duration {
			start := time.Now()
			if _, err := l.Pin(ctx, kb); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
		for b.Loop() {
			b.StopTimer()
			change()
			b.StartTimer()
			pin(live)
		}
		b.StopTimer()
		rebuilding := newLive()
		retrieval.RebuildAlways(rebuilding)
		var patched, rebuilt []time.Duration
		for range 7 {
			change()
			patched = append(patched, pin(live))
			rebuilt = append(rebuilt, pin(rebuilding))
		}
		slices.Sort(patched)
		slices.Sort(rebuilt)
		p, r := percentile(patched, 0.5), percentile(rebuilt, 0.5)
		b.ReportMetric(p, "patch-ms")
		b.ReportMetric(r, "rebuild-ms")
		b.ReportMetric(r/p, "speedup-x")
	})
}
