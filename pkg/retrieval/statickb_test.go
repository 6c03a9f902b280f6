package retrieval

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sluice-dev/sluice/pkg/embed"
)

// The tests' static kbs: built whole in memory from documents, with the
// index and search that Live uses but no store, so that tests and
// benchmarks of ranking need no Redis. Their version is 0, which a
// CachedRetriever does not cache.

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
}

// NewKB chunks docs, embeds and indexes the chunks, in document id order
// whatever the order of docs, as a fresh load by Live does.
func NewKB(ctx context.Context, name string, docs []Document, opts KBOptions) (*KB, error) {
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
	opts.Chunking = opts.Chunking.withDefaults()
	opts.BM25 = opts.BM25.withDefaults()

	docs = slices.Clone(docs)
	slices.SortFunc(docs, func(a, b Document) int { return strings.Compare(a.ID, b.ID) })
	for i := 1; i < len(docs); i++ {
		if docs[i].ID == docs[i-1].ID {
			return nil, fmt.Errorf("load kb %s: duplicate document id %q", name, docs[i].ID)
		}
	}

	kb := &KB{name: name, model: opts.Embedder.Model(), bm: opts.BM25, scratch: newScratch()}
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

// Name returns the kb's name.
func (kb *KB) Name() string { return kb.name }

// Chunks returns the kb's chunks, by document id and position in the
// document (the order in which equal scores rank).
func (kb *KB) Chunks() []Chunk { return kb.ix.chunkList() }

// chunkList returns the live chunks by document id and position.
func (ix *index) chunkList() []Chunk {
	ids := ix.docs.keys()
	slices.Sort(ids)
	out := make([]Chunk, 0, ix.chunks)
	for _, id := range ids {
		d, _ := ix.docs.get(id)
		for _, s := range d.slots {
			p, j := ix.at(s)
			out = append(out, p.chunks[j])
		}
	}
	return out
}

// HybridOptions configures Hybrid.
type HybridOptions struct {
	// VectorWeight is as in LiveOptions.
	VectorWeight float64
}

// Hybrid serves static kbs, each searched as Live searches a kb.
type Hybrid struct {
	kbs   map[string]*KB
	names []string
	w     float64
}

// NewHybrid serves the given kbs, whose names must differ.
func NewHybrid(opts HybridOptions, kbs ...*KB) (*Hybrid, error) {
	if opts.VectorWeight == 0 {
		opts.VectorWeight = 0.5
	}
	if opts.VectorWeight < 0 || opts.VectorWeight > 1 {
		return nil, fmt.Errorf("new hybrid retriever: VectorWeight %v outside [0, 1]", opts.VectorWeight)
	}
	h := &Hybrid{kbs: map[string]*KB{}, w: opts.VectorWeight}
	for _, kb := range kbs {
		if _, dup := h.kbs[kb.Name()]; dup {
			return nil, fmt.Errorf("new hybrid retriever: kb %q given twice", kb.Name())
		}
		h.kbs[kb.Name()] = kb
		h.names = append(h.names, kb.Name())
	}
	sort.Strings(h.names)
	return h, nil
}

// KBs lists the names of the loaded kbs, sorted.
func (h *Hybrid) KBs() []string { return slices.Clone(h.names) }

// Has reports whether a kb of that name is loaded.
func (h *Hybrid) Has(name string) bool { _, ok := h.kbs[name]; return ok }

// Pin returns a loaded kb, which does not change.
func (h *Hybrid) Pin(_ context.Context, name string) (Pinned, error) {
	kb, ok := h.kbs[name]
	if !ok {
		return nil, &UnknownKBError{KB: name}
	}
	return pinned{kb: kb, w: h.w}, nil
}

// Retrieve returns the q.K best chunks of q.KB. An unknown kb yields an
// *UnknownKBError.
func (h *Hybrid) Retrieve(ctx context.Context, q Query) (Result, error) {
	kb, ok := h.kbs[q.KB]
	if !ok {
		return Result{}, &UnknownKBError{KB: q.KB}
	}
	return kb.search(ctx, q, h.w)
}
