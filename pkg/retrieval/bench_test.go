package retrieval

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/kbstore"
)

// syntheticKB has 10,000 one-chunk documents of 60 words drawn from a
// Zipf-distributed vocabulary of 5,000 pseudo-words, so that postings
// lists have realistic skew.
var syntheticKB = sync.OnceValues(func() (*KB, error) {
	rng := rand.New(rand.NewPCG(7, 11))
	syllables := []string{"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "be", "fi", "ho", "ja"}
	vocab := make([]string, 5000)
	for i := range vocab {
		var b strings.Builder
		for range 2 + rng.IntN(3) {
			b.WriteString(syllables[rng.IntN(len(syllables))])
		}
		vocab[i] = b.String() + strconv.Itoa(i%7)
	}
	zipf := rand.NewZipf(rng, 1.1, 2, uint64(len(vocab)-1))
	docs := make([]Document, 10000)
	for i := range docs {
		words := make([]string, 60)
		for j := range words {
			words[j] = vocab[zipf.Uint64()]
		}
		docs[i] = Document{ID: "doc" + strconv.Itoa(i), Title: words[0], Text: strings.Join(words, " ") + "."}
	}
	return NewKB(context.Background(), "synthetic", docs, KBOptions{
		Embedder: embed.NewLocal(embed.LocalOptions{}),
	})
})

func BenchmarkHybridRetrieve(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, kb *KB, text string) {
		h := newHybrid(b, HybridOptions{}, kb)
		q := Query{KB: kb.Name(), Text: text, Vector: queryVector(b, text), K: 10}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := h.Retrieve(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("builtin", func(b *testing.B) {
		run(b, mustBuiltin(b), "how does a token bucket refill")
	})
	b.Run("synthetic-10k", func(b *testing.B) {
		kb, err := syntheticKB()
		if err != nil {
			b.Fatal(err)
		}
		// Three frequent and two rarer words: long postings lists.
		c := kb.Chunks()[42].Text
		words := strings.Fields(c)
		run(b, kb, strings.Join(words[:5], " "))
	})
	b.Run("synthetic-10k-parallel", func(b *testing.B) {
		kb, err := syntheticKB()
		if err != nil {
			b.Fatal(err)
		}
		h := newHybrid(b, HybridOptions{}, kb)
		text := strings.Join(strings.Fields(kb.Chunks()[42].Text)[:5], " ")
		q := Query{KB: kb.Name(), Text: text, Vector: queryVector(b, text), K: 10}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := h.Retrieve(ctx, q); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkNewKBBuiltin(b *testing.B) {
	docs, err := Builtin("sluice-docs")
	if err != nil {
		b.Fatal(err)
	}
	opts := KBOptions{Embedder: embed.NewLocal(embed.LocalOptions{})}
	for b.Loop() {
		if _, err := NewKB(context.Background(), "sluice-docs", docs, opts); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSyntheticKBFindsItsOwnChunk(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 10k-chunk kb")
	}
	kb, err := syntheticKB()
	if err != nil {
		t.Fatal(err)
	}
	if len(kb.Chunks()) != 10000 {
		t.Fatalf("synthetic kb has %d chunks", len(kb.Chunks()))
	}
	h := newHybrid(t, HybridOptions{}, kb)
	text := kb.Chunks()[42].Text
	res, err := h.Retrieve(context.Background(), Query{KB: "synthetic", Text: text, Vector: queryVector(t, text), K: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Chunks[0].ID != kb.Chunks()[42].ID {
		t.Errorf("querying with a chunk's own text found %s first", res.Chunks[0].ID)
	}
}

func BenchmarkTokenizer(b *testing.B) {
	text := strings.Repeat("token bucket refill rate limit queue the a of Requests server ", 10)
	var tok Tokenizer
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		tok.Terms(text)
	}
}

// BenchmarkPatchOrRebuild applies a change of some share of a 10k-chunk
// index's documents by patching it and by rebuilding it (no Redis: the
// index work alone), which is what Live's choice between the two weighs.
func BenchmarkPatchOrRebuild(b *testing.B) {
	const n, dims = 10000, 256
	rng := rand.New(rand.NewPCG(5, 6))
	vocab := make([]string, 20000)
	for i := range vocab {
		vocab[i] = "t" + strconv.Itoa(i)
	}
	zipf := rand.NewZipf(rng, 1.1, 2, uint64(len(vocab)-1))
	revision := func(id int, rev string) kbstore.Revision {
		words := make([]string, 60)
		for j := range words {
			words[j] = vocab[zipf.Uint64()]
		}
		vec := make([]float32, dims)
		for j := range vec {
			vec[j] = float32(rng.NormFloat64())
		}
		return kbstore.Revision{ID: "d" + strconv.Itoa(id), Rev: rev, Title: words[0], Chunks: []string{strings.Join(words, " ")}, Vectors: vec, Dims: dims}
	}
	all := make([]kbstore.Revision, n)
	for i := range all {
		all[i] = revision(i, "r0")
	}
	base, err := rebuild(newIndex(), nil, all)
	if err != nil {
		b.Fatal(err)
	}
	for _, share := range []float64{0.0001, 0.01, 0.05, 0.1, 0.2, 0.5} {
		var changed []kbstore.Revision
		for _, i := range rng.Perm(n)[:int(share*n)] {
			changed = append(changed, revision(i, "r1"))
		}
		b.Run(fmt.Sprintf("share=%g/patch", share), func(b *testing.B) {
			for b.Loop() {
				if _, err := patch(base, nil, changed); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("share=%g/rebuild", share), func(b *testing.B) {
			for b.Loop() {
				if _, err := rebuild(base, nil, changed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
