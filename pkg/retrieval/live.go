package retrieval

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/kbstore"
)

// Live serves the knowledge bases kept in a kbstore. Each kb is searched
// in an in-process index (exact hybrid search: see KB.search) that is
// brought up to the store's version before every query: a query never
// sees content older than the version it read, so a document deleted a
// moment ago is not retrieved by the next request. Catching up reads only
// the documents changed since the loaded version and patches a copy of the
// index that shares everything unchanged with the one queries are using
// meanwhile (see index); a large change rebuilds it instead.
//
// The kbs held together stay within a memory budget: the least recently
// used are dropped to make room, and loaded again by the next query that
// needs them. A load reserves what the kb will take before it reads it,
// so loads running at once stay within the budget together. A kb larger
// than the whole budget is refused with a *TooLargeError before it is read.
type Live struct {
	store  *kbstore.Store
	model  string
	w      float64
	bm     BM25Options
	logger *slog.Logger
	// rebuild decides between patching and rebuilding; tests override it.
	rebuild func(ix *index, removed, added int) bool

	budget int64

	// mu guards kbs, lru, mem, waiting, freed and each liveKB's name,
	// bytes, reserved and elem.
	mu  sync.Mutex
	kbs map[string]*liveKB
	lru list.List // of *liveKB held, the most recently used first
	mem MemoryStats
	// waiting holds the loads waiting for room, in arrival order; freed
	// is closed (and replaced) when reserved room is given back or the
	// first of them leaves, to wake the others. See reserve.
	waiting list.List
	freed   chan struct{}
	// trace, set by tests, sees the stats whenever a load reserves,
	// releases or settles; called with mu held.
	trace func(MemoryStats)
}

// LiveOptions configures Live.
type LiveOptions struct {
	// Model is the embedder model of the query vectors; a kb whose chunks
	// were embedded by another model is refused.
	Model string
	// VectorWeight is the share of cosine similarity in the fused score;
	// BM25 has the rest. Default 0.5. A query without a vector is scored by
	// BM25 alone and one without any indexed term by the vector alone,
	// whatever the weight.
	VectorWeight float64
	BM25         BM25Options
	Logger       *slog.Logger
	// MemoryBudget bounds what the kbs held take together
	// (KB.MemoryBytes); 0 is no bound.
	MemoryBudget int64
}

type liveKB struct {
	// refresh serialises catching up, so that the queries that find a kb
	// not loaded (or evicted) wait for one load of it; snap is read
	// without it.
	refresh sync.Mutex
	snap    atomic.Pointer[KB]

	name     string
	bytes    int64         // accounted in Live.mem.Loaded
	reserved int64         // accounted in Live.mem.Reserved while it loads
	elem     *list.Element // in Live.lru; nil when not held
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
	if opts.MemoryBudget < 0 {
		return nil, fmt.Errorf("new live retriever: MemoryBudget %d below 0", opts.MemoryBudget)
	}
	return &Live{store: store, model: opts.Model, w: opts.VectorWeight, bm: opts.BM25.withDefaults(),
		logger: opts.Logger, rebuild: rebuildRatherThanPatch, budget: opts.MemoryBudget, kbs: map[string]*liveKB{},
		freed: make(chan struct{})}, nil
}

// rebuildRatherThanPatch decides how to apply a change that frees the
// slots of removed chunks and fills added ones. A patch costs in
// proportion to what the change touches (the pages of its slots, and the
// postings lists of its terms, which for the frequent terms are long) and
// a rebuild in proportion to the kb. On 10k one-chunk documents
// (BenchmarkPatchOrRebuild) replacing 1% of them by patch took a tenth of
// a rebuild, 20% about a third, and 50% longer than a rebuild: the two
// cross when about a third of the documents is replaced, i.e. when
// removed+added is about two thirds of the chunks. Rebuild from half, a
// margin below that: a rebuild also packs the index. And rebuild when a
// patch would leave more free slots than live ones (mass deletions),
// since every query scans the free ones too.
func rebuildRatherThanPatch(ix *index, removed, added int) bool {
	live := ix.chunks - removed + added
	free := len(ix.free) + removed - added
	return removed+added > ix.chunks/2 || free > live
}

// KBVersion returns the version kb is at now, catching up first.
func (l *Live) KBVersion(ctx context.Context, kb string) (int64, error) {
	snap, err := l.current(ctx, kb)
	if err != nil {
		return 0, err
	}
	return snap.version, nil
}

// Pin returns kb at the version it is at now, catching up first: one
// read of the version from Redis, and none when the pinned kb is searched.
func (l *Live) Pin(ctx context.Context, kb string) (Pinned, error) {
	snap, err := l.current(ctx, kb)
	if err != nil {
		return nil, err
	}
	return pinned{kb: snap, w: l.w}, nil
}

// Retrieve returns the q.K best chunks of q.KB at its current version.
func (l *Live) Retrieve(ctx context.Context, q Query) (Result, error) {
	snap, err := l.current(ctx, q.KB)
	if err != nil {
		return Result{}, err
	}
	return snap.search(ctx, q, l.w)
}

// ErrStaleKB is returned by Lookup for a chunk whose text is no longer
// stored: its document changed after the chunk was retrieved, longer ago
// than the store's grace period.
var ErrStaleKB = errors.New("knowledge base version changed")

// Lookup returns the chunks with the given ids, in order, with Score
// zero. Chunk ids name their document's revision, so an id always means
// the same text: one no longer in the index (its document was replaced or
// deleted after it was retrieved) is read from the store, which keeps old
// revisions for a grace period; after that it is ErrStaleKB.
func (l *Live) Lookup(ctx context.Context, kb string, version int64, ids []string) ([]Chunk, error) {
	snap, err := l.loaded(ctx, kb)
	if err != nil {
		return nil, err
	}
	out := make([]Chunk, len(ids))
	find := func() (missing []int) {
		for i, id := range ids {
			if c, ok := snap.ix.chunkByID(id); ok {
				out[i] = c
			} else {
				missing = append(missing, i)
			}
		}
		return missing
	}
	missing := find()
	if len(missing) > 0 && version > snap.Version() {
		// The ids came from a newer version than this worker's index (a
		// cached result, read without a search): catch up once rather
		// than read each chunk from the store.
		if snap, err = l.current(ctx, kb); err != nil {
			return nil, err
		}
		missing = find()
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

func (l *Live) fromStore(ctx context.Context, kb, id string) (Chunk, error) {
	doc, i, rev, ok := parseChunkID(id)
	if !ok || rev == "" {
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

// entry returns kb's entry, made the most recently used.
func (l *Live) entry(kb string) *liveKB {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.kbs[kb]
	if !ok {
		e = &liveKB{name: kb}
		l.kbs[kb] = e
	}
	if e.elem != nil {
		l.lru.MoveToFront(e.elem)
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
	head, err := l.store.Head(ctx, kb)
	if err != nil {
		return nil, err
	}
	if head.Version == 0 {
		return nil, &UnknownKBError{KB: kb}
	}
	e := l.entry(kb)
	if snap := e.snap.Load(); snap.at(head) {
		return snap, nil
	}
	e.refresh.Lock()
	defer e.refresh.Unlock()
	if snap := e.snap.Load(); snap.at(head) {
		return snap, nil // caught up by another caller meanwhile
	}
	return l.catchUp(ctx, kb, e, head)
}

// at reports whether snap is at least at head: the same epoch, and a
// version no older.
func (snap *KB) at(head kbstore.Head) bool {
	return snap != nil && snap.epoch == head.Epoch && snap.version >= head.Version
}

// catchUp reads what changed since the loaded version and makes the
// index of the new version. Called with e.refresh held.
func (l *Live) catchUp(ctx context.Context, kb string, e *liveKB, head kbstore.Head) (*KB, error) {
	start := time.Now()
	old := e.snap.Load()
	if old != nil && old.epoch != head.Epoch {
		// The kb was written anew (Redis restarted empty and it was
		// seeded again): its versions count from 1 again and say nothing
		// about what this index holds. Load it whole.
		l.logger.WarnContext(ctx, "knowledge base has a new epoch, reloading it", "kb", kb, "from", old.version, "to", head.Version)
		old = nil
	}
	// A load that fails gives back what it reserved; one that succeeds
	// has already, in settle.
	defer l.release(e)
	snap, st, err := l.next(ctx, kb, e, old)
	if errors.Is(err, kbstore.ErrGone) && old != nil {
		// A changed document's revision was retired before it could be
		// read (it changed again, longer ago than the grace period): the
		// change log no longer leads from the loaded version to the
		// current one. Load the whole kb instead.
		l.logger.WarnContext(ctx, "knowledge base changes unreadable, reloading it", "kb", kb, "from", old.version, "err", err)
		snap, st, err = l.next(ctx, kb, e, nil)
	}
	if err != nil {
		return nil, err
	}
	e.snap.Store(snap)
	l.settle(ctx, kb, e, snap.MemoryBytes())
	var from int64
	if old != nil {
		from = old.version
	}
	l.logger.InfoContext(ctx, "knowledge base caught up", "kb", kb, "from", from, "to", snap.version,
		"changed", st.changed, "patched", st.patched, "docs", snap.ix.ndocs, "chunks", snap.ix.chunks, "bytes", snap.MemoryBytes(),
		"took", time.Since(start).Round(time.Microsecond))
	return snap, nil
}

type catchUpStats struct {
	changed int  // documents
	patched bool // or rebuilt
}

// next returns the kb's current version, made from old (nil: from
// scratch) and the documents changed since.
func (l *Live) next(ctx context.Context, kb string, e *liveKB, old *KB) (*KB, catchUpStats, error) {
	var since int64
	scratch := newScratch()
	if old != nil {
		since, scratch = old.version, old.scratch
	} else {
		if err := l.reserve(ctx, kb, e); err != nil {
			return nil, catchUpStats{}, err
		}
		l.mu.Lock()
		l.mem.Loads++
		l.mu.Unlock()
		model, err := l.store.Model(ctx, kb)
		if err != nil {
			return nil, catchUpStats{}, err
		}
		if model != l.model {
			return nil, catchUpStats{}, fmt.Errorf("load kb %s: its chunks are embedded with %q, this worker embeds queries with %q", kb, model, l.model)
		}
	}
	head, changes, err := l.store.Changes(ctx, kb, since)
	if err != nil {
		return nil, catchUpStats{}, err
	}
	if old != nil && head.Epoch != old.epoch {
		// Written anew since its head was read: changes since old's
		// version mean nothing in the new epoch.
		return l.next(ctx, kb, e, nil)
	}
	base := newIndex()
	if old != nil {
		base = old.ix
	}
	// A document changed and changed back is no change to the index.
	var deleted []string
	var load []kbstore.Change
	removed := 0
	for _, c := range changes {
		d, indexed := base.docs.get(c.ID)
		if indexed && d.rev == c.Rev {
			continue
		}
		if indexed {
			removed += len(d.slots)
		}
		if c.Rev == "" {
			deleted = append(deleted, c.ID)
		} else {
			load = append(load, c)
		}
	}
	revs, err := l.store.Load(ctx, kb, load)
	if err != nil {
		return nil, catchUpStats{}, err
	}
	added := 0
	for _, r := range revs {
		added += len(r.Chunks)
	}
	st := catchUpStats{changed: len(deleted) + len(revs)}
	var ix *index
	if old == nil || l.rebuild(base, removed, added) {
		ix, err = rebuild(base, deleted, revs)
	} else {
		st.patched = true
		ix, err = patch(base, deleted, revs)
	}
	if err != nil {
		return nil, catchUpStats{}, fmt.Errorf("load kb %s: %w", kb, err)
	}
	return &KB{name: kb, model: l.model, version: head.Version, epoch: head.Epoch, bm: l.bm, ix: ix, scratch: scratch}, st, nil
}

// patch applies the deletions and new revisions to an edit of base.
func patch(base *index, deleted []string, revs []kbstore.Revision) (*index, error) {
	e := base.edit()
	for _, id := range deleted {
		e.remove(id)
	}
	for _, r := range revs {
		e.remove(r.ID)
		if err := e.add(r.ID, r.Rev, r.Title, r.Chunks, r.Vectors, false); err != nil {
			return nil, err
		}
	}
	return e.done(), nil
}

// rebuild makes a new index of base's documents, without the deleted
// ones and with the new revisions, in document id order: the index a
// fresh load of the same version would make. Unchanged documents are
// copied from base, not read again.
func rebuild(base *index, deleted []string, revs []kbstore.Revision) (*index, error) {
	changed := make(map[string]int, len(deleted)+len(revs))
	for _, id := range deleted {
		changed[id] = -1
	}
	for i, r := range revs {
		changed[r.ID] = i
	}
	ids := base.docs.keys()
	ids = slices.DeleteFunc(ids, func(id string) bool { _, ok := changed[id]; return ok })
	for _, r := range revs {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	e := newIndex().edit()
	var vecs []float32
	var texts []string
	for _, id := range ids {
		if i, ok := changed[id]; ok {
			r := revs[i]
			if err := e.add(id, r.Rev, r.Title, r.Chunks, r.Vectors, false); err != nil {
				return nil, err
			}
			continue
		}
		d, _ := base.docs.get(id)
		vecs, texts = vecs[:0], texts[:0]
		var title string
		for _, s := range d.slots {
			p, j := base.at(s)
			title = p.chunks[j].Title
			texts = append(texts, p.chunks[j].Text)
			vecs = append(vecs, base.vec(s)...)
		}
		if err := e.add(id, d.rev, title, texts, vecs, true); err != nil {
			return nil, err
		}
	}
	return e.done(), nil
}
