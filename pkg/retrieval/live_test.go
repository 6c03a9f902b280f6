package retrieval_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

const testModel = "test/8"

// randomKB writes random documents to a kb of a store: few words and
// few dimensions, so that queries match many chunks, and documents that
// repeat one another word for word, so that scores tie.
type randomKB struct {
	rng   *rand.Rand
	store *kbstore.Store
	kb    string
	vocab []string
	// twin is the text and vectors of the last document, for the next to
	// copy.
	twin kbstore.Revision
}

func newRandomKB(t *testing.T, seed uint64) *randomKB {
	vocab := make([]string, 60)
	for i := range vocab {
		vocab[i] = fmt.Sprintf("w%02d", i)
	}
	return &randomKB{
		rng:   rand.New(rand.NewPCG(seed, 1)),
		store: kbstore.New(testRedis.Client(t), kbstore.Options{Prefix: prefix(t)}),
		kb:    "random",
		vocab: vocab,
	}
}

// word draws from a skewed distribution: a few words are in most chunks.
func (r *randomKB) word() string {
	return r.vocab[int(float64(len(r.vocab))*math.Pow(r.rng.Float64(), 2.5))]
}

func (r *randomKB) text(n int) string {
	words := make([]string, n)
	for i := range words {
		words[i] = r.word()
	}
	return strings.Join(words, " ")
}

func (r *randomKB) vector() []float32 {
	v := make([]float32, 8)
	for i := range v {
		v[i] = float32(r.rng.NormFloat64())
	}
	return v
}

func (r *randomKB) doc() string { return fmt.Sprintf("d%02d", r.rng.IntN(40)) }

func (r *randomKB) revision(id string) kbstore.Revision {
	if r.twin.Rev != "" && r.rng.IntN(5) == 0 {
		twin := r.twin
		twin.ID = id
		twin.Rev = fmt.Sprintf("%016x", r.rng.Uint64())
		return twin
	}
	rev := kbstore.Revision{ID: id, Rev: fmt.Sprintf("%016x", r.rng.Uint64()), Title: r.text(2), Dims: 8}
	for range 1 + r.rng.IntN(4) {
		rev.Chunks = append(rev.Chunks, r.text(3+r.rng.IntN(15)))
		rev.Vectors = append(rev.Vectors, r.vector()...)
	}
	r.twin = rev
	return rev
}

// step makes one random change: a put of one to three documents (new,
// replaced or unchanged) or a delete.
func (r *randomKB) step(t *testing.T) {
	t.Helper()
	if r.rng.IntN(4) == 0 {
		if _, _, err := r.store.Delete(context.Background(), r.kb, r.doc()); err != nil {
			t.Fatal(err)
		}
		return
	}
	r.put(t)
}

// put puts one to three documents.
func (r *randomKB) put(t *testing.T) {
	t.Helper()
	var revs []kbstore.Revision
	seen := map[string]bool{}
	for range 1 + r.rng.IntN(3) {
		id := r.doc()
		if !seen[id] {
			seen[id] = true
			revs = append(revs, r.revision(id))
		}
	}
	if _, err := r.store.Put(context.Background(), r.kb, testModel, revs); err != nil {
		t.Fatal(err)
	}
}

func (r *randomKB) queries() []retrieval.Query {
	var qs []retrieval.Query
	for range 6 {
		qs = append(qs,
			retrieval.Query{KB: r.kb, Text: r.text(1 + r.rng.IntN(3)), Vector: r.vector(), K: 1 + r.rng.IntN(8)},
			retrieval.Query{KB: r.kb, Text: r.text(2), K: 5},                 // lexical only
			retrieval.Query{KB: r.kb, Text: "zzz", Vector: r.vector(), K: 5}, // vector only
		)
	}
	// Everything, so that every score is compared.
	return append(qs, retrieval.Query{KB: r.kb, Text: r.word(), Vector: r.vector(), K: 1000})
}

func newTestLive(t *testing.T, store *kbstore.Store) *retrieval.Live {
	t.Helper()
	l, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: testModel, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func sameResults(a, b retrieval.Result) error {
	if a.KBVersion != b.KBVersion || len(a.Chunks) != len(b.Chunks) {
		return fmt.Errorf("version %d, %d chunks; want version %d, %d chunks", a.KBVersion, len(a.Chunks), b.KBVersion, len(b.Chunks))
	}
	for i := range a.Chunks {
		x, y := a.Chunks[i], b.Chunks[i]
		if x.ID != y.ID || x.Text != y.Text || x.Title != y.Title || math.Abs(x.Score-y.Score) > 1e-9 {
			return fmt.Errorf("chunk %d is %s (%.12f), want %s (%.12f)", i, x.ID, x.Score, y.ID, y.Score)
		}
	}
	return nil
}

// After any sequence of changes, an index patched change by change, one
// rebuilt from memory change by change and one loaded afresh give the
// same results, scores included.
func TestLivePatchedIndexEqualsFreshOne(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(3) {
		r := newRandomKB(t, seed)
		r.kb = fmt.Sprint("random", seed)
		patched, rebuilt := newTestLive(t, r.store), newTestLive(t, r.store)
		retrieval.PatchAlways(patched)
		retrieval.RebuildAlways(rebuilt)
		r.put(t)
		for step := range 150 {
			// Several changes between queries now and then: a catch-up
			// applies them at once.
			n := 1
			if r.rng.IntN(3) == 0 {
				n += r.rng.IntN(6)
			}
			for range n {
				r.step(t)
			}
			fresh := newTestLive(t, r.store)
			for _, q := range r.queries() {
				want, err := fresh.Retrieve(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				for name, l := range map[string]*retrieval.Live{"patched": patched, "rebuilt": rebuilt} {
					got, err := l.Retrieve(ctx, q)
					if err != nil {
						t.Fatal(err)
					}
					if err := sameResults(got, want); err != nil {
						t.Fatalf("seed %d step %d, %s index, query %+v: %v", seed, step, name, q, err)
					}
				}
			}
		}
	}
}

// Queries go on against the version they started with while catch-ups
// make new ones (run with -race): every result is whole and versions only
// grow.
func TestLiveQueriesDuringCatchUp(t *testing.T) {
	ctx := context.Background()
	r := newRandomKB(t, 42)
	r.put(t)
	l := newTestLive(t, r.store)
	retrieval.PatchAlways(l)
	qs := r.queries()
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			var last int64
			for i := w; !stop.Load(); i++ {
				res, err := l.Retrieve(ctx, qs[i%len(qs)])
				if err == nil && res.KBVersion < last {
					err = fmt.Errorf("version %d after %d", res.KBVersion, last)
				}
				for _, c := range res.Chunks {
					if err == nil && (c.Text == "" || !strings.HasPrefix(c.ID, c.DocID+"#")) {
						err = fmt.Errorf("chunk %+v", c)
					}
				}
				if err != nil {
					errs <- err
					return
				}
				last = res.KBVersion
			}
		})
	}
	for range 200 {
		r.step(t)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A cache miss reads the kb's version once: the pinned kb is searched
// without asking Redis again.
func TestCachedLiveReadsVersionOnce(t *testing.T) {
	ctx := context.Background()
	r, l, counter := liveCountingVersionReads(t, 7)
	c := retrieval.NewCachedRetriever(l, testRedis.Client(t), retrieval.CacheOptions{Prefix: prefix(t), Logger: quiet})
	q := retrieval.Query{KB: r.kb, Text: r.word(), K: 3}
	for i, wantHit := range []bool{false, true} {
		before := counter.n.Load()
		if _, hit, err := c.Get(ctx, q); err != nil || hit != wantHit {
			t.Fatalf("Get %d: hit=%v err=%v", i, hit, err)
		}
		if n := counter.n.Load() - before; n != 1 {
			t.Errorf("Get %d (hit=%v) read the kb version %d times, want once", i, wantHit, n)
		}
	}
}

// liveCountingVersionReads puts a random kb in the store and returns it,
// a Live retriever over it whose Redis client counts the reads of the kb's
// version key, and that counter.
func liveCountingVersionReads(t *testing.T, seed uint64) (*randomKB, *retrieval.Live, *cmdCounter) {
	t.Helper()
	store := kbstore.New(testRedis.Client(t), kbstore.Options{Prefix: prefix(t)})
	r := newRandomKB(t, seed)
	r.store = store
	r.put(t)
	reads := getsOf(store.VersionKey(r.kb))
	counted := testRedis.Client(t)
	counted.AddHook(reads)
	return r, newTestLive(t, kbstore.New(counted, kbstore.Options{Prefix: prefix(t)})), reads
}

// getsOf counts reads of key (GET, or MGET with it first), pipelined or
// not.
func getsOf(key string) *cmdCounter {
	return &cmdCounter{match: func(args []any) bool {
		if len(args) < 2 || args[1] != key {
			return false
		}
		cmd := fmt.Sprint(args[0])
		return strings.EqualFold(cmd, "get") || strings.EqualFold(cmd, "mget")
	}}
}

// With the version key known, a hit is one round trip — the version and
// the entry read by one script — and the kb's index is not consulted.
func TestCachedHitIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	r, l, versionReads := liveCountingVersionReads(t, 11)
	cmds := &cmdCounter{}
	cacheClient := testRedis.Client(t)
	cacheClient.AddHook(cmds)
	c := retrieval.NewCachedRetriever(l, cacheClient, retrieval.CacheOptions{Prefix: prefix(t), Logger: quiet, VersionKey: r.store.VersionKey})
	q := retrieval.Query{KB: r.kb, Text: r.word(), K: 3}
	miss, hit, err := c.Get(ctx, q)
	if err != nil || hit {
		t.Fatalf("first Get: hit=%v err=%v", hit, err)
	}
	cmdsBefore, readsBefore := cmds.n.Load(), versionReads.n.Load()
	got, hit, err := c.Get(ctx, q)
	if err != nil || !hit || got.KBVersion != miss.KBVersion || len(got.Chunks) != len(miss.Chunks) {
		t.Fatalf("second Get: hit=%v err=%v result %+v", hit, err, got)
	}
	if n := cmds.n.Load() - cmdsBefore; n != 1 {
		t.Errorf("a hit sent %d commands, want 1", n)
	}
	if n := versionReads.n.Load() - readsBefore; n != 0 {
		t.Errorf("a hit consulted the index (%d version reads)", n)
	}
	// A change to the kb makes the entry unreachable in the same trip.
	r.put(t)
	if _, hit, err := c.Get(ctx, q); err != nil || hit {
		t.Fatalf("after a change: hit=%v err=%v", hit, err)
	}
}

// cmdCounter counts the commands sent that match (every one if match is
// nil), pipelined or not.
type cmdCounter struct {
	match func(args []any) bool
	n     atomic.Int64
}

func (c *cmdCounter) count(cmd redis.Cmder) {
	if c.match == nil || c.match(cmd.Args()) {
		c.n.Add(1)
	}
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// A kb written anew after Redis lost it counts from version 1 again in a
// new epoch: a worker that had loaded a later version of the old one
// reloads it instead of keeping its stale index.
func TestLiveReloadsANewEpoch(t *testing.T) {
	ctx := context.Background()
	r := newRandomKB(t, 5)
	for range 6 {
		r.step(t)
	}
	r.put(t)
	l := newTestLive(t, r.store)
	everything := retrieval.Query{KB: r.kb, Text: r.word(), Vector: r.vector(), K: 1000}
	before, err := l.Retrieve(ctx, everything)
	if err != nil || before.KBVersion < 2 {
		t.Fatalf("before: v%d %v", before.KBVersion, err)
	}
	rdb := testRedis.Client(t)
	keys, _ := rdb.Keys(ctx, prefix(t)+"kb:{"+r.kb+"}:*").Result()
	if err := rdb.Del(ctx, keys...).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	fresh := kbstore.Revision{ID: "only", Rev: "r1", Title: "fresh", Dims: 8, Chunks: []string{"w00 fresh content"}, Vectors: r.vector()}
	if _, err := r.store.Put(ctx, r.kb, testModel, []kbstore.Revision{fresh}); err != nil {
		t.Fatal(err)
	}
	after, err := l.Retrieve(ctx, everything)
	if err != nil {
		t.Fatal(err)
	}
	if after.KBVersion != 1 || len(after.Chunks) != 1 || after.Chunks[0].DocID != "only" {
		t.Fatalf("after the kb was written anew: v%d, %d chunks (%+v); want v1 with only the new document", after.KBVersion, len(after.Chunks), after.Chunks)
	}
}
