package retrieval

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/kbstore"
)

// syntheticRevisions makes n documents of chunks chunks of words words
// each, drawn from a vocabulary of vocab words with Zipf-like frequencies
// (as prose has), with dims-dimensional vectors.
func syntheticRevisions(seed uint64, n, chunks, words, vocab, dims int) []kbstore.Revision {
	rng := rand.New(rand.NewPCG(seed, 2))
	word := func() string {
		// Rank r is drawn with probability about 1/r.
		r := int(math.Exp(rng.Float64()*math.Log(float64(vocab)))) - 1
		return fmt.Sprintf("w%dx", r)
	}
	revs := make([]kbstore.Revision, n)
	for i := range revs {
		r := kbstore.Revision{ID: fmt.Sprintf("doc-%06d", i), Rev: fmt.Sprintf("%016x", rng.Uint64()), Title: word() + " " + word(), Dims: dims}
		for range chunks {
			ws := make([]string, words)
			for k := range ws {
				ws[k] = word()
			}
			r.Chunks = append(r.Chunks, strings.Join(ws, " "))
			for range dims {
				r.Vectors = append(r.Vectors, float32(rng.NormFloat64()))
			}
		}
		revs[i] = r
	}
	return revs
}

func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// The index's account of its memory (what the budget is charged) and
// ingestion's estimate of the same documents (what a kb is refused by)
// both stay within a stated factor of what the Go heap really grows by
// when the index is built from documents read from the store: from 0.8×
// to 1.25× of it, for small and large chunks, few and many dimensions.
func TestMemoryEstimate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds indexes of tens of MiB")
	}
	cases := []struct {
		docs, chunks, words, vocab, dims int
	}{
		{docs: 4000, chunks: 3, words: 90, vocab: 30000, dims: 64},   // prose, a small embedder
		{docs: 1000, chunks: 4, words: 90, vocab: 30000, dims: 384},  // a common embedder's size
		{docs: 20000, chunks: 1, words: 20, vocab: 5000, dims: 16},   // many short chunks
		{docs: 300, chunks: 10, words: 400, vocab: 50000, dims: 256}, // long chunks, a large vocabulary
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%dx%dx%dw/%dd", c.docs, c.chunks, c.words, c.dims), func(t *testing.T) {
			before := heapAlloc()
			// The revisions are made inside the measured window, as a load
			// decodes them: the index keeps their strings, not their vectors.
			revs := syntheticRevisions(1, c.docs, c.chunks, c.words, c.vocab, c.dims)
			var estimate int64
			for _, r := range revs {
				estimate += EstimateBytes(r)
			}
			ix, err := rebuild(newIndex(), nil, revs)
			if err != nil {
				t.Fatal(err)
			}
			revs = nil
			grown := int64(heapAlloc() - before)
			measured := ix.memBytes()
			runtime.KeepAlive(ix)
			t.Logf("heap grew %d KiB; index accounts %d KiB (%.2f×), ingestion estimated %d KiB (%.2f×)",
				grown>>10, measured>>10, float64(measured)/float64(grown), estimate>>10, float64(estimate)/float64(grown))
			for name, got := range map[string]int64{"index account": measured, "ingestion estimate": estimate} {
				if r := float64(got) / float64(grown); r < 0.8 || r > 1.25 {
					t.Errorf("%s %d is %.2f× the heap's growth %d, outside [0.8, 1.25]", name, got, r, grown)
				}
			}
		})
	}
}

// Patching keeps the index's account as a rebuild of the same documents
// makes it, but for the pages of the slots the patch left free.
func TestMemoryAccountFollowsPatches(t *testing.T) {
	revs := syntheticRevisions(2, 300, 2, 40, 3000, 8)
	base, err := rebuild(newIndex(), nil, revs)
	if err != nil {
		t.Fatal(err)
	}
	more := syntheticRevisions(3, 40, 3, 40, 3000, 8)
	for i := range more {
		more[i].ID = fmt.Sprintf("doc-%06d", i*5) // replaces every fifth of the first 200
	}
	patched, err := patch(base, []string{"doc-000001", "doc-000002"}, more)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := rebuild(base, []string{"doc-000001", "doc-000002"}, more)
	if err != nil {
		t.Fatal(err)
	}
	if patched.heap != fresh.heap {
		t.Errorf("patched documents account %d bytes, rebuilt %d", patched.heap, fresh.heap)
	}
	if patched.memBytes() < fresh.memBytes() {
		t.Errorf("patched %d bytes, below the packed rebuild's %d", patched.memBytes(), fresh.memBytes())
	}
	var sum int64
	for _, id := range fresh.docs.keys() {
		d, _ := fresh.docs.get(id)
		sum += d.heap
	}
	if sum != fresh.heap {
		t.Errorf("documents sum to %d, index says %d", sum, fresh.heap)
	}
}
