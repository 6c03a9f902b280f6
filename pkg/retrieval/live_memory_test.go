package retrieval_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// putSizedKB writes a kb of docs documents, each of three chunks of words
// of the kb's own ("<kb>w<i>"), recording each revision's memory as
// ingestion does. Every kb made with the same docs has the same shape, so
// about the same size.
func putSizedKB(t *testing.T, store *kbstore.Store, kb string, docs int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(len(kb)), 7))
	var revs []kbstore.Revision
	for d := range docs {
		r := kbstore.Revision{ID: fmt.Sprintf("d%03d", d), Rev: fmt.Sprintf("%016x", rng.Uint64()), Title: kb + " document", Dims: 8}
		for range 3 {
			words := make([]string, 40)
			for i := range words {
				words[i] = fmt.Sprintf("%sw%d", strings.ReplaceAll(kb, "/", ""), rng.IntN(400))
			}
			r.Chunks = append(r.Chunks, strings.Join(words, " "))
			for range 8 {
				r.Vectors = append(r.Vectors, float32(rng.NormFloat64()))
			}
		}
		r.Memory = retrieval.EstimateBytes(r)
		revs = append(revs, r)
	}
	if _, err := store.Put(context.Background(), kb, testModel, revs); err != nil {
		t.Fatal(err)
	}
}

func newBudgetLive(t *testing.T, store *kbstore.Store, budget int64) *retrieval.Live {
	t.Helper()
	l, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: testModel, Logger: quiet, MemoryBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ask retrieves from kb and checks the answer is from kb.
func ask(t testing.TB, l *retrieval.Live, kb string) {
	res, err := l.Retrieve(context.Background(), retrieval.Query{KB: kb, Text: strings.ReplaceAll(kb, "/", "") + "w7", K: 3})
	if err != nil {
		t.Errorf("retrieve from %s: %v", kb, err)
		return
	}
	if res.KB != kb || len(res.Chunks) == 0 {
		t.Errorf("retrieve from %s: %+v", kb, res)
	}
}

// sizeOf is what kb takes loaded alone.
func sizeOf(t *testing.T, store *kbstore.Store, kb string) int64 {
	t.Helper()
	l := newBudgetLive(t, store, 0)
	ask(t, l, kb)
	return l.MemoryStats().Loaded
}

// A kb larger than the whole budget is refused before it is read, with
// an error naming its size and the budget, every time it is asked for;
// the kbs within the budget are served beside it.
func TestLiveKBLargerThanItsBudgetIsRefused(t *testing.T) {
	store := kbstore.New(testRedis.Client(t), kbstore.Options{Prefix: prefix(t)})
	putSizedKB(t, store, "acme/big", 200)
	putSizedKB(t, store, "small", 5)
	u, err := store.Usage(context.Background(), "acme/big")
	if err != nil {
		t.Fatal(err)
	}
	budget := u.Memory / 2
	l := newBudgetLive(t, store, budget)
	for range 3 {
		_, err := l.Retrieve(context.Background(), retrieval.Query{KB: "acme/big", Text: "acmebigw7", K: 3})
		var tl *retrieval.TooLargeError
		if !errors.Is(err, kbstore.ErrTooLarge) || !errors.As(err, &tl) {
			t.Fatalf("retrieve from a kb twice the budget: %v", err)
		}
		if *tl != (retrieval.TooLargeError{KB: "big", Bytes: u.Memory, Budget: budget}) {
			t.Fatalf("refusal %+v, want the kb's name, its recorded memory %d and the budget %d", *tl, u.Memory, budget)
		}
	}
	ask(t, l, "small")
	st := l.MemoryStats()
	if st.Refused != 3 || st.Loads != 1 || st.KBs != 1 || st.Loaded <= 0 || st.Loaded > budget {
		t.Fatalf("memory stats %+v: want 3 refusals, only the small kb loaded", st)
	}
}

// Eviction drops the least recently used kb, not the least recently
// loaded: a kb asked for again stays, and the one not asked for since
// goes.
func TestLiveEvictsTheLeastRecentlyUsed(t *testing.T) {
	store := kbstore.New(testRedis.Client(t), kbstore.Options{Prefix: prefix(t)})
	for _, kb := range []string{"a", "b", "c"} {
		putSizedKB(t, store, kb, 30)
	}
	size := sizeOf(t, store, "a")
	l := newBudgetLive(t, store, size*5/2) // two fit, not three
	loads := func() uint64 { return l.MemoryStats().Loads }
	ask(t, l, "a")
	ask(t, l, "b")
	ask(t, l, "a") // a is now more recent than b
	if loads() != 2 {
		t.Fatalf("%d loads for a, b, a; want 2", loads())
	}
	ask(t, l, "c") // evicts b
	ask(t, l, "a")
	if st := l.MemoryStats(); st.Loads != 3 || st.Evictions != 1 || st.KBs != 2 {
		t.Fatalf("after c: %+v; want a kept, b evicted", st)
	}
	ask(t, l, "b") // loaded again, evicts c (a was used after it)
	ask(t, l, "a")
	if st := l.MemoryStats(); st.Loads != 4 || st.Evictions != 2 {
		t.Fatalf("after b again: %+v; want b loaded again and c evicted", st)
	}
	ask(t, l, "c")
	if st := l.MemoryStats(); st.Loads != 5 || st.Evictions != 3 {
		t.Fatalf("after c again: %+v; want c loaded again, b evicted", st)
	}
}

// With several kbs asked for in turn, what is held never exceeds the
// budget, however many kbs there are, and every answer is right.
func TestLiveStaysWithinBudgetWithSeveralKBs(t *testing.T) {
	store := kbstore.New(testRedis.Client(t), kbstore.Options{Prefix: prefix(t)})
	kbs := []string{"k1", "k2", "k3", "k4", "k5", "k6"}
	for _, kb := range kbs {
		putSizedKB(t, store, kb, 20)
	}
	size := sizeOf(t, store, "k1")
	budget := size * 7 / 2 // three of six
	l := newBudgetLive(t, store, budget)
	rng := rand.New(rand.NewPCG(3, 3))
	for range 200 {
		ask(t, l, kbs[rng.IntN(len(kbs))])
		if st := l.MemoryStats(); st.Loaded > budget || st.KBs > 3 {
			t.Fatalf("memory stats %+v: past the budget %d", st, budget)
		}
	}
	st := l.MemoryStats()
	if st.Evictions == 0 || st.Loads != st.Evictions+uint64(st.KBs) {
		t.Fatalf("memory stats %+v: every load beyond the kbs held is an eviction", st)
	}
}

// Queries racing for an evicted kb load it once, and queries of several
// kbs racing under a budget that holds only some stay right (run with
// -race).
func TestLiveReloadsAnEvictedKBOnce(t *testing.T) {
	store := kbstore.New(testRedis.Client(t), kbstore.Options{Prefix: prefix(t)})
	kbs := []string{"r1", "r2", "r3", "r4"}
	for _, kb := range kbs {
		putSizedKB(t, store, kb, 20)
	}
	size := sizeOf(t, store, "r1")
	l := newBudgetLive(t, store, size*3/2) // one at a time
	ask(t, l, "r1")
	ask(t, l, "r2") // evicts r1
	before := l.MemoryStats()
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() { ask(t, l, "r1") })
	}
	wg.Wait()
	if st := l.MemoryStats(); st.Loads != before.Loads+1 {
		t.Fatalf("32 queries of an evicted kb loaded it %d times, want once", st.Loads-before.Loads)
	}

	for g := range 16 {
		wg.Go(func() {
			for i := range 20 {
				ask(t, l, kbs[(g+i)%len(kbs)])
			}
		})
	}
	wg.Wait()
	if st := l.MemoryStats(); st.KBs != 1 || st.Loaded > size*3/2 {
		t.Fatalf("memory stats %+v after the race: want one kb held, within the budget", st)
	}
}
