package retrieval

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	// BatchSize is the number of chunks per Embed call. Default 64.
	BatchSize int
	// Logger receives one line per loaded kb. Default slog.Default().
	Logger *slog.Logger
}

// KB is a knowledge base at one version: its chunks, their unit-length
// embeddings and a BM25 index (see index). It is immutable and safe for
// concurrent use; Live makes the next version of a kb by patching a copy
// that shares everything unchanged with this one.
type KB struct {
	name    string
	hash    string
	model   string
	version int64
	// epoch is the store's epoch of version (kbstore.Head).
	epoch string
	bm    BM25Options
	ix    *index
	// scratch holds *scoreScratch; the versions of a live kb share it.
	scratch *sync.Pool
}

func newScratch() *sync.Pool {
	return &sync.Pool{New: func() any { return new(scoreScratch) }}
}

// NewKB chunks docs, embeds and indexes the chunks.
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

	kb := &KB{name: name, model: opts.Embedder.Model(), bm: opts.BM25, scratch: newScratch()}
	kb.hash = contentHash(kb.model, docs, opts)
	chunks := make([][]string, len(docs))
	var texts []string // what is embedded: title and text
	for i, d := range docs {
		chunks[i] = Split(d.Text, opts.Chunking)
		for _, text := range chunks[i] {
			texts = append(texts, indexed(d.Title, text))
		}
	}
	if len(texts) == 0 {
		return nil, fmt.Errorf("load kb %s: documents hold no text", name)
	}
	vecs, err := embedChunks(ctx, opts.Embedder, texts, opts.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("load kb %s: %w", name, err)
	}
	e := newIndex().edit()
	dims := len(vecs) / len(texts)
	at := 0
	for i, d := range docs {
		if len(chunks[i]) == 0 {
			continue
		}
		n := len(chunks[i])
		if err := e.add(d.ID, "", d.Title, chunks[i], vecs[at*dims:(at+n)*dims], false); err != nil {
			return nil, fmt.Errorf("load kb %s: %w", name, err)
		}
		at += n
	}
	kb.ix = e.done()
	opts.Logger.InfoContext(ctx, "loaded knowledge base", "kb", name, "docs", len(docs),
		"chunks", kb.ix.chunks, "version", kb.version, "hash", kb.hash[:12],
		"embedder", kb.model, "took", time.Since(start).Round(time.Millisecond))
	return kb, nil
}

// embedChunks embeds texts in batches, into one array of vectors back to
// back.
func embedChunks(ctx context.Context, emb embed.Embedder, texts []string, batch int) ([]float32, error) {
	var out []float32
	dims := 0
	for lo := 0; lo < len(texts); lo += batch {
		hi := min(lo+batch, len(texts))
		vecs, err := emb.Embed(ctx, texts[lo:hi])
		if err != nil {
			return nil, fmt.Errorf("embed chunks %d-%d with %s: %w", lo, hi-1, emb.Model(), err)
		}
		if len(vecs) != hi-lo {
			return nil, fmt.Errorf("embed chunks %d-%d with %s: got %d vectors", lo, hi-1, emb.Model(), len(vecs))
		}
		for i, v := range vecs {
			if dims == 0 {
				dims = len(v)
				out = make([]float32, 0, len(texts)*dims)
			}
			if len(v) != dims || dims == 0 {
				return nil, fmt.Errorf("embed chunk %d with %s: %d dimensions, want %d", lo+i, emb.Model(), len(v), dims)
			}
			out = append(out, v...)
		}
	}
	return out, nil
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

// Version returns the kb's version: the store's for Live, 0 for NewKB.
func (kb *KB) Version() int64 { return kb.version }

// Hash returns the hex SHA-256 content hash that the version stands for.
func (kb *KB) Hash() string { return kb.hash }

// Model returns the embedder model the chunks were embedded with.
func (kb *KB) Model() string { return kb.model }

// Dims returns the embedding length.
func (kb *KB) Dims() int { return kb.ix.dims }

// Docs returns the number of documents.
func (kb *KB) Docs() int { return kb.ix.ndocs }

// Chunks returns the kb's chunks, by document id and position in the
// document (the order in which equal scores rank).
func (kb *KB) Chunks() []Chunk { return kb.ix.chunkList() }
