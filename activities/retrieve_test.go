package activities_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
	"go.temporal.io/sdk/temporal"
)

func TestRetrieveCachesByKBVersion(t *testing.T) {
	h := newHarness(t, nil)
	version, err := h.kb.KBVersion(context.Background(), kbName)
	if err != nil || version <= 0 {
		t.Fatalf("kb version %d, %v: the kb must be versioned for the cache", version, err)
	}
	in := activities.RetrieveInput{RequestID: "r1", KB: kbName, Query: query, K: 8}
	first := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, in)
	if first.CacheHit || first.KBVersion != version || len(first.Hits) != in.K {
		t.Fatalf("first retrieve: hit %v, version %d, %d hits; want a miss of version %d with %d hits",
			first.CacheHit, first.KBVersion, len(first.Hits), version, in.K)
	}
	for i, hit := range first.Hits {
		if hit.ID == "" || (i > 0 && hit.Score > first.Hits[i-1].Score) {
			t.Fatalf("hits not best first with ids: %+v", first.Hits)
		}
	}
	in.RequestID = "r2"
	second := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, in)
	if !second.CacheHit || second.KBVersion != version || !slices.Equal(second.Hits, first.Hits) {
		t.Fatalf("second retrieve: %+v, want a cache hit with the first's hits", second)
	}
	for _, id := range []string{"r1", "r2"} {
		evs := h.events(t, id)
		if len(evs) != 1 {
			t.Fatalf("%s events: %+v, want one", id, evs)
		}
		if st := decode[events.Stage](t, evs[0]); st.Stage != "retrieval" {
			t.Fatalf("%s stage event %+v, want retrieval", id, st)
		}
	}
}

func TestRetrieveUnknownKB(t *testing.T) {
	h := newHarness(t, nil)
	_, err := local[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{
		RequestID: "r1", KB: "no-such-kb", Query: query, K: 3,
	})
	wantAppError(t, err, activities.ErrTypeBadRequest, true)
	// Stage events mark a stage's start, so the failed stage has its one.
	if evs := h.events(t, "r1"); len(evs) != 1 || evs[0].Type != events.TypeStage {
		t.Fatalf("events for a failed retrieval: %+v", evs)
	}
}

// A kb larger than the worker's memory budget fails retrieval at once
// with a non-retryable ErrTypeKBTooLarge naming its size and the budget,
// without reading the kb; a kb within it is served by the same worker.
func TestRetrieveKBLargerThanTheBudget(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	kb, err := newKnowledgeBase(rdb, kbstore.Options{Prefix: testenv.KeyPrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	u, err := kb.store.Usage(ctx, kbName)
	if err != nil || u.Memory <= u.Bytes {
		t.Fatalf("usage %+v, %v: ingestion records what the kb needs loaded, more than its text", u, err)
	}
	budget := u.Memory - 1
	live, err := retrieval.NewLive(kb.store, retrieval.LiveOptions{Model: kb.ing.Embedder.Model(), Logger: quiet, MemoryBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.kb = &knowledgeBase{store: kb.store, ing: kb.ing, live: live} })
	_, err = local[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{RequestID: "r1", KB: kbName, Query: query, K: 3})
	wantAppError(t, err, activities.ErrTypeKBTooLarge, true)
	want := (&retrieval.TooLargeError{KB: kbName, Bytes: u.Memory, Budget: budget}).Error()
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q, want it to say %q", err, want)
	}
	if st := live.MemoryStats(); st.Loads != 0 || st.Refused != 1 || st.Loaded != 0 {
		t.Fatalf("memory stats %+v: the kb must be refused before it is read", st)
	}
}

func TestRerankKeepsBestK(t *testing.T) {
	h := newHarness(t, nil)
	ret := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{
		RequestID: "r1", KB: kbName, Query: query, K: 10,
	})
	out := mustLocal[activities.RerankOutput](t, h, h.acts.Rerank, activities.RerankInput{
		RequestID: "r1", KB: kbName, KBVersion: ret.KBVersion, Query: query, Hits: ret.Hits, K: 3,
	})
	if len(out.Hits) != 3 {
		t.Fatalf("kept %d hits, want 3", len(out.Hits))
	}
	candidates := map[string]bool{}
	for _, hit := range ret.Hits {
		candidates[hit.ID] = true
	}
	seen := map[string]bool{}
	for i, hit := range out.Hits {
		if !candidates[hit.ID] || seen[hit.ID] {
			t.Fatalf("hit %q is not a distinct candidate: %+v", hit.ID, out.Hits)
		}
		seen[hit.ID] = true
		if i > 0 && hit.Score > out.Hits[i-1].Score {
			t.Fatalf("hits not best first: %+v", out.Hits)
		}
	}
	// The refs resolve to the kb's chunks.
	if _, err := h.kb.Lookup(context.Background(), kbName, ret.KBVersion, []string{out.Hits[0].ID}); err != nil {
		t.Fatal(err)
	}
	st := ofType(h.events(t, "r1"), events.TypeStage)
	if len(st) != 2 || decode[events.Stage](t, st[1]).Stage != "rerank" {
		t.Fatalf("stage events %+v, want retrieval then rerank", st)
	}
}

// Refs whose document changed since they were retrieved, after the old
// revision's grace period (the worker has caught up with the change, so
// the index no longer holds them either), cannot be answered from.
func TestRerankStaleKBVersion(t *testing.T) {
	kb := retiringKnowledge(t)
	h := newHarness(t, func(o *harnessOptions) { o.kb = kb })
	ret := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{
		RequestID: "r1", KB: kbName, Query: query, K: 5,
	})
	kb.rewrite(t, ret.KBVersion, ret.Hits[0].ID)
	_, err := local[activities.RerankOutput](t, h, h.acts.Rerank, activities.RerankInput{
		RequestID: "r1", KB: kbName, KBVersion: ret.KBVersion, Query: query, Hits: ret.Hits, K: 3,
	})
	// Rerank runs as a local activity, whose error reaches the SDK's retry
	// decision unconverted: errors.As finds the non-retryable error inside
	// the wrapping, as temporal.IsRetryable does.
	wantAppError(t, err, activities.ErrTypeBadRequest, true)
	if !errors.Is(err, retrieval.ErrStaleKB) {
		t.Fatalf("error %v does not say the kb is stale", err)
	}
}

// unreachableChunks fails every lookup as a Redis that cannot be reached
// does.
type unreachableChunks struct{}

func (unreachableChunks) Lookup(context.Context, string, int64, []string) ([]retrieval.Chunk, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

// A store that cannot be read is not the client's mistake: the lookup is
// retried (and, if Redis stays away, ends unavailable), never refused as
// a bad request carrying the store's error text.
func TestRerankWithTheStoreUnreachableIsRetried(t *testing.T) {
	h := newHarness(t, nil)
	ret := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{
		RequestID: "r1", KB: kbName, Query: query, K: 5,
	})
	h.acts.Chunks = unreachableChunks{}
	_, err := local[activities.RerankOutput](t, h, h.acts.Rerank, activities.RerankInput{
		RequestID: "r1", KB: kbName, KBVersion: ret.KBVersion, Query: query, Hits: ret.Hits, K: 3,
	})
	if err == nil {
		t.Fatal("rerank over an unreachable store succeeded")
	}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) && (appErr.NonRetryable() || appErr.Type() == activities.ErrTypeBadRequest) {
		t.Fatalf("unreachable store refused as %q (non-retryable %v): %v", appErr.Type(), appErr.NonRetryable(), err)
	}
	if !conn.Unreachable(err) {
		t.Fatalf("error %v does not say the store was unreachable", err)
	}
}
