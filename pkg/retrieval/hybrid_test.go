package retrieval

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/embed"
)

func newHybrid(t testing.TB, opts HybridOptions, kbs ...*KB) *Hybrid {
	t.Helper()
	h, err := NewHybrid(opts, kbs...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHybridAnswersRealQuestions(t *testing.T) {
	h := newHybrid(t, HybridOptions{}, mustBuiltin(t))
	cases := []struct{ question, doc string }{
		{"how does a token bucket refill", "token-bucket"},
		{"What is weighted fair queuing?", "weighted-fair-queuing"},
		{"why is p99 latency more important than the average", "tail-latency"},
		{"how do consumer groups work in redis streams", "redis-streams"},
		{"what happens when a temporal workflow replays", "temporal-workflows"},
		{"how does continuous batching improve throughput", "continuous-batching"},
		{"how to count tokens with tiktoken", "tiktoken"},
		{"what is an idempotency key", "idempotency"},
		{"how does the browser reconnect to server-sent events", "server-sent-events"},
		{"what happens if a semaphore holder crashes", "leased-semaphores"},
		{"how much GPU memory does the KV cache use", "kv-cache"},
		{"what is Little's law", "littles-law"},
		{"when does a circuit breaker open", "circuit-breaker"},
		{"how does reciprocal rank fusion work", "hybrid-search"},
		{"heartbeat timeout for a long running activity", "temporal-activities"},
	}
	for _, tc := range cases {
		res, err := h.Retrieve(context.Background(), Query{KB: "sluice-docs", Text: tc.question, Vector: queryVector(t, tc.question), K: 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Chunks) != 3 {
			t.Fatalf("%q: %d chunks, want 3", tc.question, len(res.Chunks))
		}
		if got := res.Chunks[0].DocID; got != tc.doc {
			var ids []string
			for _, c := range res.Chunks {
				ids = append(ids, c.ID)
			}
			t.Errorf("%q: top chunk from %s (%v), want %s", tc.question, got, ids, tc.doc)
		}
		for i := 1; i < len(res.Chunks); i++ {
			if res.Chunks[i].Score > res.Chunks[i-1].Score {
				t.Errorf("%q: chunks not in score order: %v", tc.question, res.Chunks)
			}
		}
	}
}

// The local embedder alone must already rank sensibly: a passage sharing
// the query's words above unrelated ones.
func TestLocalEmbedderAloneRanksBuiltinCorpus(t *testing.T) {
	h := newHybrid(t, HybridOptions{VectorWeight: 1}, mustBuiltin(t))
	for _, tc := range []struct{ question, doc string }{
		{"how does a token bucket refill", "token-bucket"},
		{"redis streams consumer groups", "redis-streams"},
		{"continuous batching throughput", "continuous-batching"},
		{"what is an idempotency key", "idempotency"},
	} {
		res, err := h.Retrieve(context.Background(), Query{KB: "sluice-docs", Text: "", Vector: queryVector(t, tc.question), K: 1})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Chunks[0].DocID; got != tc.doc {
			t.Errorf("%q by vector only: top chunk from %s, want %s", tc.question, got, tc.doc)
		}
	}
}

func TestBM25RanksExactTermFirst(t *testing.T) {
	docs := []Document{
		{ID: "a", Title: "Queues", Text: "Queues hold requests while workers are busy. Long queues add latency."},
		{ID: "b", Title: "Errors", Text: "The server answered ERR_QUOTA_7731 when the tenant's quota was exhausted."},
		{ID: "c", Title: "Quotas", Text: "Quotas limit tenants. A tenant over quota gets an error from the server."},
	}
	kb, err := NewKB(context.Background(), "t", docs, KBOptions{Embedder: embed.NewLocal(embed.LocalOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	h := newHybrid(t, HybridOptions{}, kb)
	// No vector: BM25 alone. The rare exact term beats common words.
	res, err := h.Retrieve(context.Background(), Query{KB: "t", Text: "what does ERR_QUOTA_7731 mean for a tenant quota", K: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Chunks) != 2 || res.Chunks[0].DocID != "b" || res.Chunks[1].DocID != "c" {
		t.Errorf("BM25 order = %v, want b then c (a has no query term)", res.Chunks)
	}
	if res.Chunks[0].Score != 1 {
		t.Errorf("best BM25-only score = %v, want 1 after min-max normalisation", res.Chunks[0].Score)
	}
}

func TestBM25Weights(t *testing.T) {
	e := newIndex().edit()
	for i, text := range []string{
		"limiter limiter limiter redis",
		"limiter redis",
		"redis redis redis redis redis redis redis redis redis redis redis limiter",
	} {
		if err := e.add(strconv.Itoa(i), "", "", []string{text}, []float32{1}, false); err != nil {
			t.Fatal(err)
		}
	}
	ix := e.done()
	score := func(term string, doc int) float64 {
		ps, _ := ix.terms.get(term)
		d, _ := ix.docs.get(strconv.Itoa(doc))
		n := float64(ix.chunks)
		for _, p := range ps {
			if p.slot == d.slots[0] {
				pg, j := ix.at(p.slot)
				return bm25Weight(BM25Options{}.withDefaults(), bm25IDF(n, float64(len(ps))), float64(p.tf), float64(pg.length[j]), float64(ix.length)/n)
			}
		}
		return 0
	}
	// Saturation: three occurrences beat one, but by less than 3x.
	if s3, s1 := score("limiter", 0), score("limiter", 1); s3 <= s1 || s3 >= 3*s1 {
		t.Errorf("tf saturation: tf=3 %v, tf=1 %v", s3, s1)
	}
	// Length normalisation: one occurrence in a long chunk counts less.
	if long, short := score("limiter", 2), score("limiter", 1); long >= short {
		t.Errorf("length normalisation: long %v, short %v", long, short)
	}
	if _, ok := ix.terms.get("the"); ok {
		t.Error("stop word indexed")
	}
}

func TestHybridErrors(t *testing.T) {
	h := newHybrid(t, HybridOptions{}, mustBuiltin(t))
	ctx := context.Background()

	_, err := h.Retrieve(ctx, Query{KB: "nope", Text: "x", K: 3})
	var unknown *UnknownKBError
	if !errors.Is(err, ErrUnknownKB) || !errors.As(err, &unknown) || unknown.KB != "nope" {
		t.Errorf("unknown kb: err = %v", err)
	}
	if _, err := h.Pin(ctx, "nope"); !errors.Is(err, ErrUnknownKB) {
		t.Errorf("Pin of unknown kb: err = %v", err)
	}
	if _, err := h.Retrieve(ctx, Query{KB: "sluice-docs", Text: "x", K: 0}); err == nil {
		t.Error("K=0 accepted")
	}
	if _, err := h.Retrieve(ctx, Query{KB: "sluice-docs", Text: "x", Vector: make([]float32, 3), K: 1}); err == nil || !strings.Contains(err.Error(), "3 dimensions") {
		t.Errorf("wrong dimensions: err = %v", err)
	}
	nan := make([]float32, 256)
	nan[7] = float32(nanValue())
	if _, err := h.Retrieve(ctx, Query{KB: "sluice-docs", Text: "x", Vector: nan, K: 1}); err == nil {
		t.Error("NaN vector accepted")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := h.Retrieve(cancelled, Query{KB: "sluice-docs", Text: "token", K: 1}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v", err)
	}
	if _, err := NewHybrid(HybridOptions{}, mustBuiltin(t), mustBuiltin(t)); err == nil {
		t.Error("duplicate kb accepted")
	}
	if _, err := NewHybrid(HybridOptions{VectorWeight: 2}); err == nil {
		t.Error("VectorWeight 2 accepted")
	}
}

func nanValue() float64 {
	zero := 0.0
	return zero / zero
}

func TestHybridEdgeCases(t *testing.T) {
	kb := mustBuiltin(t)
	h := newHybrid(t, HybridOptions{}, kb)
	ctx := context.Background()
	if got := h.KBs(); !slices.Equal(got, []string{"sluice-docs"}) || !h.Has("sluice-docs") || h.Has("x") {
		t.Errorf("KBs() = %v", got)
	}
	// Nothing to go on: no indexed term and no vector.
	res, err := h.Retrieve(ctx, Query{KB: "sluice-docs", Text: "the of and zzzqqq", K: 5})
	if err != nil || len(res.Chunks) != 0 || res.KB != "sluice-docs" {
		t.Errorf("no signal: %+v, %v", res, err)
	}
	// K beyond the kb is cut to its size.
	res, err = h.Retrieve(ctx, Query{KB: "sluice-docs", Text: "x", Vector: queryVector(t, "token"), K: 100000})
	if err != nil || len(res.Chunks) != len(kb.Chunks()) {
		t.Errorf("huge K: %d chunks, %v; want all %d", len(res.Chunks), err, len(kb.Chunks()))
	}
	// The same query twice gives the same answer (pooled scratch is reset).
	q := Query{KB: "sluice-docs", Text: "redis streams", Vector: queryVector(t, "redis streams"), K: 5}
	a, _ := h.Retrieve(ctx, q)
	b, _ := h.Retrieve(ctx, q)
	if !slices.Equal(a.Chunks, b.Chunks) {
		t.Errorf("repeated query differs: %v vs %v", a.Chunks, b.Chunks)
	}
}

func TestKBIndependentOfDocumentOrder(t *testing.T) {
	docs, err := Builtin("sluice-docs")
	if err != nil {
		t.Fatal(err)
	}
	reversed := slices.Clone(docs)
	slices.Reverse(reversed)
	kb, err := NewKB(context.Background(), "sluice-docs", reversed, KBOptions{Embedder: embed.NewLocal(embed.LocalOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kb.Chunks(), mustBuiltin(t).Chunks()) {
		t.Error("chunks depend on document order")
	}
	if _, err := NewKB(context.Background(), "x", append(docs, docs[0]), KBOptions{Embedder: embed.NewLocal(embed.LocalOptions{})}); err == nil {
		t.Error("duplicate document id accepted")
	}
}

func TestTopKHeap(t *testing.T) {
	scores := []float64{0.3, 0.9, 0.1, 0.9, 0.5, 0.7, 0.3}
	worse := func(a, b hit) bool {
		if a.score != b.score {
			return a.score < b.score
		}
		return a.slot > b.slot
	}
	var top []hit
	for i, s := range scores {
		top = pushTop(top, 4, hit{s, int32(i)}, worse)
	}
	sortHits(top, worse)
	want := []int32{1, 3, 5, 4} // ties keep index order
	for i, h := range top {
		if h.slot != want[i] {
			t.Fatalf("top = %v, want indices %v", top, want)
		}
	}
}
