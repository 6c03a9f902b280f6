package activities_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/rerank"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// Workload of BenchmarkRepeatedQuestions: distinctQuestions questions,
// each asked timesAsked times, in a shuffled order. Run it with
// -benchtime=1000x to replay the workload exactly once.
const (
	distinctQuestions = 50
	timesAsked        = 20
)

// BenchmarkRepeatedQuestions measures the non-LLM stages of a chat request
// (EmbedQuery, Retrieve, Rerank, run one after another as the workflow
// runs them) over a workload of repeated questions, with the L1 embedding
// cache and the L2 retrieval cache on, and with both off. The two
// configurations share the kb, the reranker and the Redis that stage
// events go to, and serve the same question in turn (alternating which
// goes first), so that noise from a shared machine falls on both alike.
// Each run starts with empty caches: the first asking of each question
// misses.
//
// Reported per configuration: the p50 and p99 of a request's three stages
// in µs, and their ratios off/on (above 1: the caches make it faster).
// Neither tier is free: an L2 hit still reads the kb version and then the
// entry from Redis, so with the local embedder (microseconds) over a kb of
// a few dozen documents the caches cost more than the work they save. They
// pay off as the search grows (the 10k-chunk kb) or the embedder is remote.
func BenchmarkRepeatedQuestions(b *testing.B) {
	b.Run("kb=sluice-docs/embedder=local", func(b *testing.B) {
		benchRepeated(b, benchKB(b, "bench-docs", 0), embed.NewLocal(embed.LocalOptions{}))
	})
	b.Run("kb=sluice-docs+10k/embedder=local", func(b *testing.B) {
		benchRepeated(b, benchKB(b, "bench-10k", 10000), embed.NewLocal(embed.LocalOptions{}))
	})
	// A remote embedder's round trip is what L1 saves most; this one is
	// on loopback and computes the local embedder's vectors, so the gap to
	// a real model server (milliseconds of inference) is a lower bound.
	b.Run("kb=sluice-docs/embedder=openai-loopback", func(b *testing.B) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { testenv.ServeLocalEmbeddings(w, r) }))
		defer srv.Close()
		remote, err := embed.NewOpenAI(embed.OpenAIOptions{BaseURL: srv.URL, Model: "loopback-local"})
		if err != nil {
			b.Fatal(err)
		}
		benchRepeated(b, benchKB(b, "bench-docs", 0), modelAs{remote, embed.NewLocal(embed.LocalOptions{}).Model()})
	})
}

// benchStore is the kb store the benchmarks read, filled once per process.
type benchStore struct {
	name  string
	rdb   *redis.Client
	store *kbstore.Store
	live  *retrieval.Live
}

var benchKBs sync.Map // kb name -> *benchStore, built once per test binary

// benchKB ingests the built-in corpus, plus extra synthetic one-chunk
// documents, into a kb of that name through the production ingestion
// path, and serves it through a Live retriever.
func benchKB(b *testing.B, name string, extra int) *benchStore {
	b.Helper()
	if s, ok := benchKBs.Load(name); ok {
		return s.(*benchStore)
	}
	ctx := context.Background()
	cfg := config.Default()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	emb := embed.NewLocal(embed.LocalOptions{})
	store := kbstore.New(rdb, kbstore.Options{Prefix: "bench:"})
	ing := &ingest.Ingester{Store: store, Embedder: emb, Chunking: retrieval.ChunkingFor(cfg.Retrieval.ChunkTokens, cfg.Retrieval.ChunkOverlapTokens)}
	builtin, err := retrieval.Builtin(kbName)
	if err != nil {
		b.Fatal(err)
	}
	docs := make([]ingest.Document, 0, len(builtin)+extra)
	for _, d := range builtin {
		docs = append(docs, ingest.Document{ID: d.ID, Title: d.Title, Text: d.Text})
	}
	for i := range extra {
		var sb strings.Builder
		for w := range 60 {
			fmt.Fprintf(&sb, "w%d ", (i*7919+w*104729)%50000)
		}
		docs = append(docs, ingest.Document{ID: fmt.Sprint("syn", i), Title: fmt.Sprint("synthetic ", i), Text: sb.String()})
	}
	for lo := 0; lo < len(docs); lo += 100 {
		if _, err := ing.Put(ctx, name, docs[lo:min(lo+100, len(docs))]); err != nil {
			b.Fatal(err)
		}
	}
	live, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: emb.Model(), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := live.KBVersion(ctx, name); err != nil { // load it before timing
		b.Fatal(err)
	}
	s := &benchStore{name: name, rdb: rdb, store: store, live: live}
	actual, _ := benchKBs.LoadOrStore(name, s)
	return actual.(*benchStore)
}

// benchQuestions are distinctQuestions questions about the built-in
// corpus, two phrasings per document title.
func benchQuestions() []string {
	docs, _ := retrieval.Builtin(kbName)
	var qs []string
	for _, d := range docs {
		title := strings.ToLower(d.Title)
		qs = append(qs, "What is "+title+"?", "How does "+title+" work in an LLM gateway?")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(qs), func(i, j int) { qs[i], qs[j] = qs[j], qs[i] })
	return qs[:distinctQuestions]
}

func benchWorkload() []string {
	qs := benchQuestions()
	w := make([]string, 0, len(qs)*timesAsked)
	for range timesAsked {
		w = append(w, qs...)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
	return w
}

var benchRun int

func benchRepeated(b *testing.B, kb *benchStore, emb embed.Embedder) {
	ctx := context.Background()
	cfg := config.Default()
	benchRun++
	prefix := fmt.Sprintf("bench:%s:%d:", b.Name(), benchRun)

	base := activities.Chat{
		Redis:    kb.rdb,
		Events:   events.NewLog(kb.rdb, events.LogOptions{KeyPrefix: prefix, TTL: time.Minute}),
		Chunks:   kb.live,
		Reranker: rerank.NewLexical(rerank.LexicalOptions{}),
		Logger:   quiet,
		Options:  activities.Options{TopK: cfg.Retrieval.TopK, ChunkTokens: cfg.Retrieval.ChunkTokens},
	}
	on, off := base, base
	on.Embeddings = embed.NewCache(emb, kb.rdb, embed.CacheOptions{
		Prefix: prefix, TTL: time.Hour, LRUSize: cfg.Embedding.LRUSize, Logger: quiet,
	})
	l2 := retrieval.NewCachedRetriever(kb.live, kb.rdb, retrieval.CacheOptions{
		Prefix: prefix, TTL: time.Hour, Version: emb.Model(), DocIndexKey: kb.store.L2DocKey, VersionKey: kb.store.VersionKey,
		RefsOnly: true, Logger: quiet,
	})
	on.Retriever = cachedRetriever{l2}
	off.Embeddings = uncachedEmbeddings{emb}
	off.Retriever = uncachedRetriever{kb.live}

	workload := benchWorkload()
	var latOn, latOff []time.Duration
	hits := 0
	i := 0
	for b.Loop() {
		q := workload[i%len(workload)]
		id := fmt.Sprint(i)
		if i%2 == 0 {
			d, hit := runStages(ctx, b, &on, "on-"+id, kb.name, q, cfg)
			latOn = append(latOn, d)
			if hit {
				hits++
			}
			d, _ = runStages(ctx, b, &off, "off-"+id, kb.name, q, cfg)
			latOff = append(latOff, d)
		} else {
			d, _ := runStages(ctx, b, &off, "off-"+id, kb.name, q, cfg)
			latOff = append(latOff, d)
			d, hit := runStages(ctx, b, &on, "on-"+id, kb.name, q, cfg)
			latOn = append(latOn, d)
			if hit {
				hits++
			}
		}
		i++
	}
	b.StopTimer()
	pOn50, pOn99 := percentile(latOn, 0.50), percentile(latOn, 0.99)
	pOff50, pOff99 := percentile(latOff, 0.50), percentile(latOff, 0.99)
	b.ReportMetric(0, "ns/op") // one op is a request in each configuration: meaningless
	b.ReportMetric(us(pOn50), "on-p50-µs")
	b.ReportMetric(us(pOn99), "on-p99-µs")
	b.ReportMetric(us(pOff50), "off-p50-µs")
	b.ReportMetric(us(pOff99), "off-p99-µs")
	b.ReportMetric(float64(pOff50)/float64(pOn50), "p50-off/on")
	b.ReportMetric(float64(pOff99)/float64(pOn99), "p99-off/on")
	b.ReportMetric(float64(hits)/float64(len(latOn)), "L2-hit-rate")
}

// runStages runs a request's three non-LLM stages and returns their total
// latency and whether retrieval was answered by L2.
func runStages(ctx context.Context, b *testing.B, a *activities.Chat, id, kb, q string, cfg config.Config) (time.Duration, bool) {
	start := time.Now()
	if _, err := a.EmbedQuery(ctx, activities.EmbedInput{RequestID: id, Query: q}); err != nil {
		b.Fatal(err)
	}
	ret, err := a.Retrieve(ctx, activities.RetrieveInput{RequestID: id, KB: kb, Query: q, K: cfg.Retrieval.Candidates})
	if err != nil {
		b.Fatal(err)
	}
	if len(ret.Hits) == 0 {
		b.Fatalf("%q retrieved nothing", q)
	}
	if _, err := a.Rerank(ctx, activities.RerankInput{RequestID: id, KB: kb, KBVersion: ret.KBVersion, Query: q, Hits: ret.Hits, K: cfg.Retrieval.TopK}); err != nil {
		b.Fatal(err)
	}
	return time.Since(start), ret.CacheHit
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// uncachedEmbeddings computes every query's vector: the L1 tier off.
type uncachedEmbeddings struct{ e embed.Embedder }

func (u uncachedEmbeddings) Get(ctx context.Context, query string) ([]float32, string, error) {
	vecs, err := u.e.Embed(ctx, []string{query})
	if err != nil {
		return nil, "", err
	}
	return vecs[0], embed.TierMiss, nil
}

// uncachedRetriever searches the kb for every query: the L2 tier off.
type uncachedRetriever struct{ r retrieval.Retriever }

func (u uncachedRetriever) Retrieve(ctx context.Context, q retrieval.Query) (retrieval.Result, bool, error) {
	res, err := u.r.Retrieve(ctx, q)
	return res, false, err
}

// modelAs reports another Model, so that the loopback embedder, which
// returns the local embedder's vectors, can query the kb those made.
type modelAs struct {
	embed.Embedder
	model string
}

func (m modelAs) Model() string { return m.model }
