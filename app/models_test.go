package app

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/rerank"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

var quiet = slog.New(slog.DiscardHandler)

// embeddingsServer speaks OpenAI's POST /v1/embeddings. Its vectors are
// the local embedder's at the requested dimensions, so that retrieval over
// them finds the right documents.
type embeddingsServer struct {
	*httptest.Server
	mu     sync.Mutex
	models []string
	dims   []int
	auth   []string
	inputs []string
}

func newEmbeddingsServer(t *testing.T) *embeddingsServer {
	s := &embeddingsServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/embeddings" {
			t.Errorf("embeddings server got %s %s", r.Method, r.URL.Path)
			http.NotFound(w, r)
			return
		}
		req, ok := testenv.ServeLocalEmbeddings(w, r)
		if !ok {
			return
		}
		s.mu.Lock()
		s.models = append(s.models, req.Model)
		s.dims = append(s.dims, req.Dimensions)
		s.auth = append(s.auth, r.Header.Get("Authorization"))
		s.inputs = append(s.inputs, req.Input...)
		s.mu.Unlock()
	}))
	t.Cleanup(s.Close)
	return s
}

// rerankServer speaks TEI's POST /rerank, scoring a text by how many of
// the query's words it contains.
type rerankServer struct {
	*httptest.Server
	mu      sync.Mutex
	queries []string
	auth    []string
}

func newRerankServer(t *testing.T) *rerankServer {
	s := &rerankServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/rerank" {
			t.Errorf("rerank server got %s %s", r.Method, r.URL.Path)
			http.NotFound(w, r)
			return
		}
		var req struct {
			Query string   `json:"query"`
			Texts []string `json:"texts"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.queries = append(s.queries, req.Query)
		s.auth = append(s.auth, r.Header.Get("Authorization"))
		s.mu.Unlock()
		type result struct {
			Index int     `json:"index"`
			Score float64 `json:"score"`
		}
		words := strings.Fields(strings.ToLower(strings.Trim(req.Query, "?")))
		out := make([]result, len(req.Texts))
		for i, text := range req.Texts {
			text = strings.ToLower(text)
			out[i].Index = i
			for _, w := range words {
				if strings.Contains(text, w) {
					out[i].Score++
				}
			}
		}
		slices.SortStableFunc(out, func(a, b result) int { return int(b.Score - a.Score) })
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestDefaultsAreLocalEmbedderAndLexicalReranker(t *testing.T) {
	cfg := config.Default()
	e, err := newEmbedder(cfg.Embedding, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.(*embed.Local); !ok || e.Model() != "local-hash-v1/256" {
		t.Errorf("default embedder %T %q, want *embed.Local local-hash-v1/256", e, e.Model())
	}
	r, err := newReranker(cfg.Rerank, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.(*rerank.Lexical); !ok {
		t.Errorf("default reranker %T, want *rerank.Lexical", r)
	}
}

// A config naming the openai embedder and the http reranker, set from the
// environment as a deployment would, yields activities that embed, seed
// the kbs, retrieve and rerank through the two servers, and cache under
// keys that name the remote model.
func TestRemoteEmbedderAndRerankerFromConfig(t *testing.T) {
	ctx := context.Background()
	emb := newEmbeddingsServer(t)
	rr := newRerankServer(t)
	prefix := testenv.KeyPrefix(t)
	cfg, err := config.Load("", []string{
		"SLUICE_REDIS_ADDR=" + srv.Addr,
		"SLUICE_REDIS_KEY_PREFIX=" + prefix,
		"SLUICE_EMBEDDING_PROVIDER=openai",
		"SLUICE_EMBEDDING_ENDPOINT=" + emb.URL,
		"SLUICE_EMBEDDING_MODEL=fake-embed",
		"SLUICE_EMBEDDING_DIMS=64",
		"SLUICE_EMBEDDING_API_KEY=emb-key",
		"SLUICE_RERANK_PROVIDER=http",
		"SLUICE_RERANK_ENDPOINT=" + rr.URL,
		"SLUICE_RERANK_MODEL=fake-rerank",
		"SLUICE_RERANK_API_KEY=rr-key",
	})
	if err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(t)
	c := &Core{cfg: cfg, logger: quiet, Redis: rdb}
	acts, err := c.buildChat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := acts.Reranker.Version(); v != "http:fake-rerank" {
		t.Errorf("reranker version %q, want http:fake-rerank", v)
	}

	// Seeding embedded the built-in corpus remotely.
	emb.mu.Lock()
	seeded := len(emb.inputs)
	emb.mu.Unlock()
	if seeded == 0 {
		t.Fatal("seeding the kb sent nothing to the embeddings server")
	}

	const q = "How does a Token Bucket refill?"
	vec, tier, err := acts.Embeddings.Get(ctx, q)
	if err != nil || tier != embed.TierMiss || len(vec) != 64 {
		t.Fatalf("embed query: %d dims from %q, %v; want 64 from a miss", len(vec), tier, err)
	}
	emb.mu.Lock()
	for i := range emb.models {
		if emb.models[i] != "fake-embed" || emb.dims[i] != 64 || emb.auth[i] != "Bearer emb-key" {
			t.Errorf("embeddings request %d: model %q dimensions %d auth %q", i, emb.models[i], emb.dims[i], emb.auth[i])
		}
	}
	// A remote model may be case sensitive: the query goes as asked.
	if last := emb.inputs[len(emb.inputs)-1]; last != q {
		t.Errorf("embedded %q, want the query as asked, %q", last, q)
	}
	emb.mu.Unlock()
	if c, ok := acts.Embeddings.(*embed.Cache); !ok {
		t.Errorf("embeddings are %T, want *embed.Cache", acts.Embeddings)
	} else if c.Model() != "fake-embed/64" {
		t.Errorf("embedding cache keyed by model %q, want fake-embed/64", c.Model())
	}

	kb := cfg.Retrieval.DefaultKB
	query := retrieval.Query{KB: kb, Text: q, Vector: vec, K: cfg.Retrieval.Candidates}
	res, hit, err := acts.Retriever.Retrieve(ctx, query)
	if err != nil || hit || len(res.Chunks) == 0 {
		t.Fatalf("retrieve: %d chunks, hit %v, %v", len(res.Chunks), hit, err)
	}
	if _, hit, err := acts.Retriever.Retrieve(ctx, query); err != nil || !hit {
		t.Fatalf("second retrieve: hit %v, %v; want an L2 hit", hit, err)
	}
	keys, err := rdb.Keys(ctx, prefix+"ret:*").Result()
	if err != nil || len(keys) != 1 || !strings.HasSuffix(keys[0], ":fake-embed/64|refs") {
		t.Errorf("retrieval cache keys %q (%v), want one ending in the embedder's model and the refs-only format :fake-embed/64|refs", keys, err)
	}

	ids := make([]string, len(res.Chunks))
	for i, c := range res.Chunks {
		ids[i] = c.ID
	}
	chunks, err := acts.Chunks.Lookup(ctx, kb, res.KBVersion, ids)
	if err != nil {
		t.Fatal(err)
	}
	top, err := acts.Reranker.Rerank(ctx, q, chunks, cfg.Retrieval.TopK)
	if err != nil || len(top) != cfg.Retrieval.TopK {
		t.Fatalf("rerank: %d chunks, %v", len(top), err)
	}
	if top[0].DocID != "token-bucket" {
		t.Errorf("best chunk after rerank is from %s, want token-bucket", top[0].DocID)
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if len(rr.queries) != 1 || rr.queries[0] != q || rr.auth[0] != "Bearer rr-key" {
		t.Errorf("rerank requests: queries %q auth %q", rr.queries, rr.auth)
	}
}
