package retrieval_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// reservation is what a load of kb holds against budget before it is
// read: the kb's recorded estimate and the index's fixed maps.
func reservation(t *testing.T, store *kbstore.Store, kb string, budget int64) int64 {
	t.Helper()
	u, err := store.Usage(context.Background(), kb)
	if err != nil {
		t.Fatal(err)
	}
	return min(max(u.Memory, u.Bytes)+retrieval.IndexBytes, budget)
}

// Eight kbs loaded at once, together several times the budget, never
// hold more than the budget in loaded and reserved bytes, beyond what
// the loaded indexes measure above their reservations (the last page's
// empty slots: a few hundred bytes here, where every kb fills its pages
// but for one slot). Every query is answered, or refused as too large
// for the one kb that is; when the loads are done nothing stays reserved.
func TestLiveConcurrentLoadsStayWithinBudget(t *testing.T) {
	store := kbstore.New(testRedis.Client(t), kbstore.Options{Prefix: prefix(t)})
	var kbs []string
	for i, docs := range []int{85, 170, 85, 170, 85, 170, 85, 170} { // 255 or 510 chunks
		kb := "m" + string(rune('1'+i))
		putSizedKB(t, store, kb, docs)
		kbs = append(kbs, kb)
	}
	small, large := sizeOf(t, store, "m1"), sizeOf(t, store, "m2")
	budget := large + small*3/2 // a large and a small kb, not two large
	putSizedKB(t, store, "huge", 1000)

	var sum, slack int64
	for _, kb := range kbs {
		size := sizeOf(t, store, kb)
		sum += size
		slack += max(0, size-reservation(t, store, kb, budget))
	}
	l := newBudgetLive(t, store, budget)
	var peak int64 // read and written with l's lock held, then after the queries
	retrieval.TraceMemory(l, func(st retrieval.MemoryStats) { peak = max(peak, st.Loaded+st.Reserved) })

	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, kb := range append(kbs, "huge") {
		for range 4 {
			wg.Go(func() {
				<-start
				_, err := l.Retrieve(context.Background(), retrieval.Query{KB: kb, Text: kb + "w7", K: 3})
				var tl *retrieval.TooLargeError
				switch {
				case kb == "huge" && !errors.As(err, &tl):
					t.Errorf("retrieve from a kb larger than the budget: %v, want it refused as too large", err)
				case kb != "huge" && err != nil:
					t.Errorf("retrieve from %s: %v", kb, err)
				}
			})
		}
	}
	close(start)
	wg.Wait()

	t.Logf("kbs of %d and %d bytes, %.1f× the budget of %d together: peak loaded+reserved %d (%.2f× the budget), %d bytes measured above their reservations",
		small, large, float64(sum)/float64(budget), budget, peak, float64(peak)/float64(budget), slack)
	if peak > budget+slack {
		t.Errorf("loaded+reserved peaked at %d, %.2f× the budget %d (allowed %d above it)", peak, float64(peak)/float64(budget), budget, slack)
	}
	st := l.MemoryStats()
	if st.Reserved != 0 || st.Loaded > budget || st.KBs == 0 || st.Refused != 4 {
		t.Fatalf("memory stats %+v when idle: want nothing reserved, the kbs held within the budget, the 4 queries of huge refused", st)
	}
	for _, kb := range kbs {
		ask(t, l, kb)
	}
	if st := l.MemoryStats(); st.Reserved != 0 || st.Loaded > budget {
		t.Fatalf("memory stats %+v after asking each kb again: want nothing reserved, within the budget", st)
	}
}

// A load that fails after reserving gives its reservation back: a kb of
// another embedder model fails to load, and the next kb, which needs
// nearly the whole budget, loads at once.
func TestLiveFailedLoadReleasesItsReservation(t *testing.T) {
	store := kbstore.New(testRedis.Client(t), kbstore.Options{Prefix: prefix(t)})
	putSizedKB(t, store, "near", 170)
	budget := sizeOf(t, store, "near") * 11 / 10
	var revs []kbstore.Revision
	for i := range 100 {
		r := kbstore.Revision{ID: "d" + strings.Repeat("x", i), Rev: "r1", Title: "other", Chunks: []string{"other words"}, Vectors: make([]float32, 8), Dims: 8}
		r.Memory = retrieval.EstimateBytes(r)
		revs = append(revs, r)
	}
	if _, err := store.Put(context.Background(), "other", "another-model", revs); err != nil {
		t.Fatal(err)
	}
	l := newBudgetLive(t, store, budget)
	for range 3 {
		if _, err := l.Retrieve(context.Background(), retrieval.Query{KB: "other", Text: "other", K: 3}); err == nil || !strings.Contains(err.Error(), "another-model") {
			t.Fatalf("retrieve from a kb of another model: %v, want its load refused", err)
		}
		if st := l.MemoryStats(); st.Reserved != 0 || st.Loaded != 0 {
			t.Fatalf("memory stats %+v after a failed load: want nothing reserved or loaded", st)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.Retrieve(ctx, retrieval.Query{KB: "near", Text: "nearw7", K: 3}); err != nil {
		t.Fatalf("retrieve from a kb near the budget after a failed load: %v", err)
	}
}
