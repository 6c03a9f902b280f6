package retrieval

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/kbstore"
)

// Live serves the knowledge bases kept in a kbstore. Each kb is searched
// in an in-process index (the same exact hybrid search as Hybrid) that is
// brought up to the store's version before every query: a query never
// sees content older than the version it read, so a document deleted a
// moment ago is not retrieved by the next request. Catching up reads only
// the documents changed since the loaded version; the index itself is
// rebuilt from the chunks and vectors in memory (no re-embedding).
type Live struct {
	store  *kbstore.Store
	model  string
	w      float64
	bm     BM25Options
	logger *slog.Logger

	mu  sync.Mutex
	kbs map[string]*liveKB
}

// LiveOptions configures Live.
type LiveOptions struct {
	// Model is the embedder model of the query vectors; a kb whose chunks
	// were embedded by another model is refused.
	Model string
	// VectorWeight is as in HybridOptions.
	VectorWeight float64
	BM25         BM25Options
	Logger       *slog.Logger
}

type liveKB struct {
	// refresh serialises catching up; snap is read without it.
	refresh sync.Mutex
	snap    atomic.Pointer[KB]
	docs    map[string]kbstore.Revision // as of snap; guarded by refresh
}

// NewLive serves the kbs of store.
func NewLive(store *kbstore.Store, opts LiveOptions) (*Live, error) {
	if opts.VectorWeight == 0 {
		opts.VectorWeight = 0.5
	}
	if opts.VectorWeight < 0 || opts.VectorWeight > 1 {
		return nil, fmt.Errorf("new live retriever: VectorWeight %v outside [0, 1]", opts.VectorWeight)
	}
	if opts.Model == "" {
		return nil, errors.New("new live retriever: no embedder model")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Live{store: store, model: opts.Model, w: opts.VectorWeight, bm: opts.BM25.withDefaults(),
		logger: opts.Logger, kbs: map[string]*liveKB{}}, nil
}

// KBVersion returns the version kb is at now, catching up first.
func (l *Live) KBVersion(ctx context.Context, kb string) (int64, error) {
	snap, err := l.current(ctx, kb)
	if err != nil {
		return 0, err
	}
	return snap.version, nil
}

// Retrieve returns the q.K best chunks of q.KB at its current version.
func (l *Live) Retrieve(ctx context.Context, q Query) (Result, error) {
	snap, err := l.current(ctx, q.KB)
	if err != nil {
		return Result{}, err
	}
	if len(snap.chunks) == 0 { // every document deleted: nothing to find
		return Result{KB: q.KB, KBVersion: snap.version, Chunks: []Chunk{}}, nil
	}
	return snap.search(ctx, q, l.w)
}

// Lookup returns the chunks with the given ids, in order, with Score
// zero. Chunk ids name their document's revision, so an id always means
// the same text: one no longer in the index (its document was replaced or
// deleted after it was retrieved) is read from the store, which keeps old
// revisions for a grace period; after that it is ErrStaleKB.
func (l *Live) Lookup(ctx context.Context, kb string, _ int64, ids []string) ([]Chunk, error) {
	snap, err := l.loaded(ctx, kb)
	if err != nil {
		return nil, err
	}
	out := make([]Chunk, len(ids))
	var missing []int
	for i, id := range ids {
		if j, ok := snap.byID[id]; ok {
			out[i] = snap.chunks[j]
		} else {
			missing = append(missing, i)
		}
	}
	for _, i := range missing {
		c, err := l.fromStore(ctx, kb, ids[i])
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// ChunkID names chunk i of a document revision: "<doc>#<i>@<rev>".
func ChunkID(doc string, i int, rev string) string {
	return doc + "#" + strconv.Itoa(i) + "@" + rev
}

func parseChunkID(id string) (doc string, i int, rev string, ok bool) {
	at := strings.LastIndexByte(id, '@')
	if at < 0 {
		return "", 0, "", false
	}
	hash := strings.LastIndexByte(id[:at], '#')
	if hash < 0 {
		return "", 0, "", false
	}
	i, err := strconv.Atoi(id[hash+1 : at])
	if err != nil || i < 0 {
		return "", 0, "", false
	}
	return id[:hash], i, id[at+1:], true
}

func (l *Live) fromStore(ctx context.Context, kb, id string) (Chunk, error) {
	doc, i, rev, ok := parseChunkID(id)
	if !ok {
		return Chunk{}, fmt.Errorf("look up chunk %q of %s: not a chunk id", id, kb)
	}
	revs, err := l.store.Load(ctx, kb, []kbstore.Change{{ID: doc, Rev: rev}})
	if errors.Is(err, kbstore.ErrGone) {
		return Chunk{}, fmt.Errorf("look up chunk %q of %s: %w (document changed and its old text is gone)", id, kb, ErrStaleKB)
	}
	if err != nil {
		return Chunk{}, err
	}
	r := revs[0]
	if i >= len(r.Chunks) {
		return Chunk{}, fmt.Errorf("look up chunk %q of %s: the revision has %d chunks", id, kb, len(r.Chunks))
	}
	return Chunk{ID: id, DocID: doc, Title: r.Title, Text: r.Chunks[i]}, nil
}

func (l *Live) entry(kb string) *liveKB {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.kbs[kb]
	if !ok {
		e = &liveKB{docs: map[string]kbstore.Revision{}}
		l.kbs[kb] = e
	}
	return e
}

// loaded returns the kb's index as loaded, loading it if it never was.
func (l *Live) loaded(ctx context.Context, kb string) (*KB, error) {
	if snap := l.entry(kb).snap.Load(); snap != nil {
		return snap, nil
	}
	return l.current(ctx, kb)
}

// current returns the kb's index at the store's current version.
func (l *Live) current(ctx context.Context, kb string) (*KB, error) {
	version, err := l.store.Version(ctx, kb)
	if err != nil {
		return nil, err
	}
	if version == 0 {
		return nil, &UnknownKBError{KB: kb}
	}
	e := l.entry(kb)
	if snap := e.snap.Load(); snap != nil && snap.version >= version {
		return snap, nil
	}
	e.refresh.Lock()
	defer e.refresh.Unlock()
	if snap := e.snap.Load(); snap != nil && snap.version >= version {
		return snap, nil // caught up by another caller meanwhile
	}
	return l.catchUp(ctx, kb, e)
}

// catchUp reads what changed since the loaded version and rebuilds the
// index. Called with e.refresh held.
func (l *Live) catchUp(ctx context.Context, kb string, e *liveKB) (*KB, error) {
	start := time.Now()
	var since int64
	if snap := e.snap.Load(); snap != nil {
		since = snap.version
	}
	if since == 0 {
		model, err := l.store.Model(ctx, kb)
		if err != nil {
			return nil, err
		}
		if model != l.model {
			return nil, fmt.Errorf("load kb %s: its chunks are embedded with %q, this worker embeds queries with %q", kb, model, l.model)
		}
	}
	version, changes, err := l.store.Changes(ctx, kb, since)
	if err != nil {
		return nil, err
	}
	var load []kbstore.Change
	for _, c := range changes {
		if c.Rev != "" && e.docs[c.ID].Rev != c.Rev {
			load = append(load, c)
		}
	}
	revs, err := l.store.Load(ctx, kb, load)
	if err != nil {
		return nil, err
	}
	docs := make(map[string]kbstore.Revision, len(e.docs)+len(revs))
	for id, r := range e.docs {
		docs[id] = r
	}
	for _, c := range changes {
		if c.Rev == "" {
			delete(docs, c.ID)
		}
	}
	for _, r := range revs {
		docs[r.ID] = r
	}
	snap, err := l.build(kb, version, docs)
	if err != nil {
		return nil, err
	}
	e.docs = docs
	e.snap.Store(snap)
	l.logger.InfoContext(ctx, "knowledge base caught up", "kb", kb, "from", since, "to", version,
		"changed", len(changes), "docs", len(docs), "chunks", len(snap.chunks), "took", time.Since(start).Round(time.Microsecond))
	return snap, nil
}

func (l *Live) build(kb string, version int64, docs map[string]kbstore.Revision) (*KB, error) {
	ids := make([]string, 0, len(docs))
	total := 0
	dims := 0
	for id, r := range docs {
		ids = append(ids, id)
		total += len(r.Chunks)
		if dims == 0 {
			dims = r.Dims
		}
		if r.Dims != dims {
			return nil, fmt.Errorf("load kb %s: document %s has %d dimensions, others %d", kb, id, r.Dims, dims)
		}
	}
	slices.Sort(ids)
	snap := &KB{name: kb, model: l.model, version: version, docs: len(docs), dims: dims,
		chunks: make([]Chunk, 0, total), vecs: make([]float32, 0, total*dims)}
	indexed := make([]string, 0, total)
	for _, id := range ids {
		r := docs[id]
		for i, text := range r.Chunks {
			snap.chunks = append(snap.chunks, Chunk{ID: ChunkID(id, i, r.Rev), DocID: id, Title: r.Title, Text: text})
			indexed = append(indexed, r.Title+"\n\n"+text)
		}
		snap.vecs = append(snap.vecs, r.Vectors...)
	}
	for i := range total {
		embed.Normalize(snap.vecs[i*dims : (i+1)*dims])
	}
	snap.finish(indexed, l.bm)
	return snap, nil
}
