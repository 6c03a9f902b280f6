// Package quality measures retrieval quality on a small real corpus: the
// documents under corpus/ are ingested through the production pipeline
// (chunked and embedded by the Ingester into the kb store on a real Redis,
// searched by the Live retriever, cut by the lexical reranker) and the
// hand-written questions of questions.txt are asked against them.
package quality_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/rerank"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

const kb = "quality"

// question asks for the passage of doc that contains anchor.
type question struct {
	doc, anchor, text string
	half              string // "A" or "B", alternating down the file
}

func loadQuestions(t *testing.T) []question {
	t.Helper()
	f, err := os.Open("questions.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var qs []question
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, " | ")
		if len(parts) != 3 {
			t.Fatalf("questions.txt:%d: want document | anchor | question, got %q", n, line)
		}
		half := "A"
		if len(qs)%2 == 1 {
			half = "B"
		}
		qs = append(qs, question{doc: parts[0], anchor: parts[1], text: parts[2], half: half})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return qs
}

// relevant reports whether c is the passage q asks for.
func (q question) relevant(c retrieval.Chunk) bool {
	return c.DocID == q.doc && strings.Contains(c.Text, q.anchor)
}

// system is one way of answering a question: its ranked chunks.
type system struct {
	name string
	ask  func(ctx context.Context, q string) ([]retrieval.Chunk, error)
}

// scores are the metrics of one system over some questions.
type scores struct {
	n                int
	recall3, recall5 float64
	recall10, mrr10  float64
	missed           []string
}

func score(qs []question, ranked [][]retrieval.Chunk) scores {
	var s scores
	for i, q := range qs {
		rank := 0
		for r, c := range ranked[i] {
			if r >= 10 {
				break
			}
			if q.relevant(c) {
				rank = r + 1
				break
			}
		}
		s.n++
		if rank > 0 {
			s.mrr10 += 1 / float64(rank)
			s.recall10++
		}
		if rank > 0 && rank <= 5 {
			s.recall5++
		} else {
			s.missed = append(s.missed, fmt.Sprintf("%s (%s)", q.text, q.doc))
		}
		if rank > 0 && rank <= 3 {
			s.recall3++
		}
	}
	n := float64(s.n)
	s.recall3, s.recall5, s.recall10, s.mrr10 = s.recall3/n, s.recall5/n, s.recall10/n, s.mrr10/n
	return s
}

func subset(qs []question, ranked [][]retrieval.Chunk, half string) ([]question, [][]retrieval.Chunk) {
	var q2 []question
	var r2 [][]retrieval.Chunk
	for i, q := range qs {
		if half == "" || q.half == half {
			q2 = append(q2, q)
			r2 = append(r2, ranked[i])
		}
	}
	return q2, r2
}

// TestRetrievalQuality reports recall@k and MRR@10 of the built-in
// embedder and reranker, and of baselines, on corpus/ and questions.txt,
// and fails if the production configuration falls below its floor.
func TestRetrievalQuality(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default()
	quiet := slog.New(slog.DiscardHandler)

	docs, err := retrieval.LoadDir("corpus")
	if err != nil {
		t.Fatal(err)
	}
	qs := loadQuestions(t)
	chunking := retrieval.ChunkingFor(cfg.Retrieval.ChunkTokens, cfg.Retrieval.ChunkOverlapTokens)

	// Every question must have an answer, in its document only, and the
	// random baseline needs the number of chunks and of right ones.
	total := 0
	relevantCount := make([]int, len(qs))
	for _, d := range docs {
		chunks := retrieval.Split(d.Text, chunking)
		total += len(chunks)
		for i, q := range qs {
			for _, c := range chunks {
				if q.relevant(retrieval.Chunk{DocID: d.ID, Text: c}) {
					relevantCount[i]++
				}
			}
		}
	}
	for i, q := range qs {
		if relevantCount[i] == 0 {
			t.Fatalf("question %q: no chunk of %s contains %q", q.text, q.doc, q.anchor)
		}
		for _, d := range docs {
			if d.ID != q.doc && strings.Contains(d.Text, q.anchor) {
				t.Fatalf("question %q: anchor %q is also in %s", q.text, q.anchor, d.ID)
			}
		}
	}

	emb := embed.NewLocal(embed.LocalOptions{Dims: cfg.Embedding.Dims})
	store := kbstore.New(srv.Client(t), kbstore.Options{Prefix: testenv.KeyPrefix(t)})
	ing := &ingest.Ingester{Store: store, Embedder: emb, Chunking: chunking}
	in := make([]ingest.Document, len(docs))
	for i, d := range docs {
		in[i] = ingest.Document{ID: d.ID, Title: d.Title, Text: d.Text}
	}
	if _, err := ing.Put(ctx, kb, in); err != nil {
		t.Fatal(err)
	}
	live := func(vectorWeight float64) *retrieval.Live {
		l, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: emb.Model(), VectorWeight: vectorWeight, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	vector := func(q string) []float32 {
		v, err := emb.Embed(ctx, []string{embed.NormalizeQuery(q, false)})
		if err != nil {
			t.Fatal(err)
		}
		return v[0]
	}
	hybrid, vecOnly := live(0), live(1)
	reranker := rerank.NewLexical(rerank.LexicalOptions{})
	const depth = 10
	systems := []system{
		{"bm25 only", func(ctx context.Context, q string) ([]retrieval.Chunk, error) {
			res, err := hybrid.Retrieve(ctx, retrieval.Query{KB: kb, Text: q, K: depth})
			return res.Chunks, err
		}},
		{"local embedder only", func(ctx context.Context, q string) ([]retrieval.Chunk, error) {
			res, err := vecOnly.Retrieve(ctx, retrieval.Query{KB: kb, Text: q, Vector: vector(q), K: depth})
			return res.Chunks, err
		}},
		{"hybrid retrieval", func(ctx context.Context, q string) ([]retrieval.Chunk, error) {
			res, err := hybrid.Retrieve(ctx, retrieval.Query{KB: kb, Text: q, Vector: vector(q), K: depth})
			return res.Chunks, err
		}},
		// As a request runs: retrieval.candidates chunks, reordered by the
		// reranker (which can only reorder them, so recall@10 is
		// retrieval's).
		{"hybrid + lexical rerank", func(ctx context.Context, q string) ([]retrieval.Chunk, error) {
			res, err := hybrid.Retrieve(ctx, retrieval.Query{KB: kb, Text: q, Vector: vector(q), K: cfg.Retrieval.Candidates})
			if err != nil {
				return nil, err
			}
			return reranker.Rerank(ctx, q, res.Chunks, 0)
		}},
	}

	// The random baseline, exactly: the chance that k chunks drawn at
	// random include one of the r right ones, and the expected reciprocal
	// rank of the first right one.
	var rnd [4]float64 // recall@3, @5, @10, MRR@10
	for _, r := range relevantCount {
		for i, k := range []int{3, 5, 10} {
			rnd[i] += 1 - ratioOfBinomials(total-r, total, k)
		}
		for rank := 1; rank <= 10; rank++ {
			// P(first right one at rank) = P(none in rank-1) * r/(N-rank+1)
			rnd[3] += ratioOfBinomials(total-r, total, rank-1) * float64(r) / float64(total-rank+1) / float64(rank)
		}
	}
	for i := range rnd {
		rnd[i] /= float64(len(qs))
	}
	t.Logf("corpus: %d documents, %d chunks (%s); %d questions (half A %d, half B %d)",
		len(docs), total, chunking, len(qs), (len(qs)+1)/2, len(qs)/2)
	t.Logf("%-26s %-4s %9s %9s %10s %7s", "system", "set", "recall@3", "recall@5", "recall@10", "MRR@10")
	t.Logf("%-26s %-4s %9.3f %9.3f %10.3f %7.3f", "random (expected)", "all", rnd[0], rnd[1], rnd[2], rnd[3])

	results := map[string]map[string]scores{}
	for _, sys := range systems {
		ranked := make([][]retrieval.Chunk, len(qs))
		for i, q := range qs {
			if ranked[i], err = sys.ask(ctx, q.text); err != nil {
				t.Fatalf("%s: %q: %v", sys.name, q.text, err)
			}
		}
		results[sys.name] = map[string]scores{}
		for _, half := range []string{"", "A", "B"} {
			s := score(subset(qs, ranked, half))
			results[sys.name][half] = s
			set := half
			if set == "" {
				set = "all"
			}
			t.Logf("%-26s %-4s %9.3f %9.3f %10.3f %7.3f", sys.name, set, s.recall3, s.recall5, s.recall10, s.mrr10)
		}
	}
	for _, name := range []string{"hybrid retrieval", "hybrid + lexical rerank"} {
		for _, m := range results[name][""].missed {
			t.Logf("%s: not in the top 5: %s", name, m)
		}
	}

	// Floors, from the values measured when the corpus and questions were
	// written (recall@5 0.953 and MRR@10 0.866 for hybrid retrieval, 0.977
	// and 0.853 with the reranker), less about two questions: one question
	// is 0.023 of recall@5, so a regression that loses two or three answers
	// fails, while one borderline question changing places does not. For
	// scale, random chunks would score a recall@5 of 0.128, BM25 alone
	// 0.977 and the local embedder alone 0.744: these questions name their
	// topic's words, which lexical matching finds, and the embedder only
	// hashes words and character trigrams. Nothing was tuned on the
	// questions; both halves are logged to keep it checkable if that
	// changes.
	floors := map[string]struct{ recall5, mrr float64 }{
		"hybrid retrieval":        {0.90, 0.80},
		"hybrid + lexical rerank": {0.92, 0.80},
	}
	// The embedder and reranker must not make retrieval worse than the
	// BM25 baseline it is built on, by more than one question.
	if got, base := results["hybrid + lexical rerank"][""].recall5, results["bm25 only"][""].recall5; got < base-0.03 {
		t.Errorf("hybrid + lexical rerank: recall@5 %.3f, below BM25 alone (%.3f) by more than one question", got, base)
	}
	for name, f := range floors {
		s := results[name][""]
		if s.recall5 < f.recall5 {
			t.Errorf("%s: recall@5 %.3f below its floor %.2f", name, s.recall5, f.recall5)
		}
		if s.mrr10 < f.mrr {
			t.Errorf("%s: MRR@10 %.3f below its floor %.2f", name, s.mrr10, f.mrr)
		}
	}
}

// ratioOfBinomials returns C(a, k) / C(n, k): the chance that k of n
// items drawn at random all fall among a given a of them.
func ratioOfBinomials(a, n, k int) float64 {
	if k > a {
		return 0
	}
	num := new(big.Int).Binomial(int64(a), int64(k))
	den := new(big.Int).Binomial(int64(n), int64(k))
	f, _ := new(big.Rat).SetFrac(num, den).Float64()
	return f
}
