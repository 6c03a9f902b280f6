package retrieval

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/kbstore"
)

// KBOptions configures how NewKB builds a kb.
type KBOptions struct {
	// Embedder embeds the chunks; queries must be embedded by the same
	// model. Required.
	Embedder embed.Embedder
	// Chunking bounds the chunks.
	Chunking ChunkOptions
	// BM25 sets the lexical scoring parameters, fixed into the index.
	BM25 BM25Options
	// Versions assigns the kb's version from its content hash. Nil leaves
	// the version at 0, which CachedRetriever never caches: only tests and
	// benchmarks should do that.
	Versions *Versions
	// BatchSize is the number of chunks per Embed call. Default 64.
	BatchSize int
	// Logger receives one line per loaded kb. Default slog.Default().
	Logger *slog.Logger
}

// KB is a loaded knowledge base: chunks, their unit-length embeddings in
// one contiguous array (a linear scan is then a walk through memory) and
// a BM25 index. It is immutable after NewKB and safe for concurrent use.
type KB struct {
	name    string
	hash    string
	model   string
	version int64
	docs    int
	chunks  []Chunk
	byID    map[string]int
	dims    int
	vecs    []float32
	index   bm25Index
	scratch sync.Pool // *scoreScratch
}

// NewKB chunks docs, embeds and indexes the chunks and, with
// opts.Versions, obtains the kb's version for their content.
func NewKB(ctx context.Context, name string, docs []Document, opts KBOptions) (*KB, error) {
	start := time.Now()
	if name == "" {
		return nil, errors.New("load kb: empty name")
	}
	if opts.Embedder == nil {
		return nil, fmt.Errorf("load kb %s: no embedder", name)
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("load kb %s: no documents", name)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 64
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Chunking = opts.Chunking.withDefaults()
	opts.BM25 = opts.BM25.withDefaults()

	// A canonical order makes the hash, and the tie-breaking of equal
	// scores, independent of the order the documents were listed in.
	docs = slices.Clone(docs)
	slices.SortFunc(docs, func(a, b Document) int { return strings.Compare(a.ID, b.ID) })
	for i := 1; i < len(docs); i++ {
		if docs[i].ID == docs[i-1].ID {
			return nil, fmt.Errorf("load kb %s: duplicate document id %q", name, docs[i].ID)
		}
	}

	kb := &KB{name: name, model: opts.Embedder.Model(), docs: len(docs)}
	kb.hash = contentHash(kb.model, docs, opts)
	var indexed []string // what is embedded and indexed: title and text
	for _, d := range docs {
		for i, text := range Split(d.Text, opts.Chunking) {
			kb.chunks = append(kb.chunks, Chunk{
				ID:    d.ID + "#" + strconv.Itoa(i),
				DocID: d.ID,
				Title: d.Title,
				Text:  text,
			})
			// Later chunks of a document often no longer name its topic;
			// the title does.
			indexed = append(indexed, d.Title+"\n\n"+text)
		}
	}
	if len(kb.chunks) == 0 {
		return nil, fmt.Errorf("load kb %s: documents hold no text", name)
	}
	if err := kb.embedChunks(ctx, opts.Embedder, indexed, opts.BatchSize); err != nil {
		return nil, fmt.Errorf("load kb %s: %w", name, err)
	}
	kb.finish(indexed, opts.BM25)
	if opts.Versions != nil {
		v, err := opts.Versions.Sync(ctx, name, kb.hash)
		if err != nil {
			return nil, fmt.Errorf("load kb %s: %w", name, err)
		}
		kb.version = v
	}
	opts.Logger.InfoContext(ctx, "loaded knowledge base", "kb", name, "docs", len(docs),
		"chunks", len(kb.chunks), "version", kb.version, "hash", kb.hash[:12],
		"embedder", kb.model, "took", time.Since(start).Round(time.Millisecond))
	return kb, nil
}

// finish indexes the kb's chunks, whose texts as indexed (title and text)
// are given, once its chunks and vectors are in place.
func (kb *KB) finish(indexed []string, bm BM25Options) {
	kb.index = newBM25Index(indexed, bm)
	kb.byID = make(map[string]int, len(kb.chunks))
	for i, c := range kb.chunks {
		kb.byID[c.ID] = i
	}
	kb.scratch.New = func() any { return new(scoreScratch) }
}

func (kb *KB) embedChunks(ctx context.Context, emb embed.Embedder, texts []string, batch int) error {
	for lo := 0; lo < len(texts); lo += batch {
		hi := min(lo+batch, len(texts))
		vecs, err := emb.Embed(ctx, texts[lo:hi])
		if err != nil {
			return fmt.Errorf("embed chunks %d-%d with %s: %w", lo, hi-1, kb.model, err)
		}
		if len(vecs) != hi-lo {
			return fmt.Errorf("embed chunks %d-%d with %s: got %d vectors", lo, hi-1, kb.model, len(vecs))
		}
		for i, v := range vecs {
			if kb.dims == 0 {
				kb.dims = len(v)
				kb.vecs = make([]float32, 0, len(texts)*kb.dims)
			}
			if len(v) != kb.dims || kb.dims == 0 {
				return fmt.Errorf("embed chunk %d with %s: %d dimensions, want %d", lo+i, kb.model, len(v), kb.dims)
			}
			kb.vecs = append(kb.vecs, v...)
			embed.Normalize(kb.vecs[len(kb.vecs)-kb.dims:])
		}
	}
	return nil
}

// contentHash covers everything that decides what the kb returns: the
// documents, the chunking, the BM25 parameters and the embedder, so that a
// change to any of them yields a new version.
func contentHash(model string, docs []Document, opts KBOptions) string {
	h := sha256.New()
	field := func(s string) { kbstore.HashField(h, s) }
	field("sluice-kb/1")
	field(model)
	field(fmt.Sprintf("chunk=%d/%d bm25=%g/%g", opts.Chunking.MaxWords, opts.Chunking.OverlapWords, opts.BM25.K1, opts.BM25.B))
	for _, d := range docs {
		field(d.ID)
		field(d.Title)
		field(d.Text)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Name returns the kb's name.
func (kb *KB) Name() string { return kb.name }

// Version returns the version NewKB obtained, or 0 without Versions.
func (kb *KB) Version() int64 { return kb.version }

// Hash returns the hex SHA-256 content hash that the version stands for.
func (kb *KB) Hash() string { return kb.hash }

// Model returns the embedder model the chunks were embedded with.
func (kb *KB) Model() string { return kb.model }

// Dims returns the embedding length.
func (kb *KB) Dims() int { return kb.dims }

// Docs returns the number of documents.
func (kb *KB) Docs() int { return kb.docs }

// Chunks returns a copy of the kb's chunks, in index order.
func (kb *KB) Chunks() []Chunk { return slices.Clone(kb.chunks) }
