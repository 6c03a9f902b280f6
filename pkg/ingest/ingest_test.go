package ingest_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type fixture struct {
	store *kbstore.Store
	ing   *ingest.Ingester
	live  *retrieval.Live
	emb   embed.Embedder
}

func newFixture(t testing.TB) fixture {
	store := kbstore.New(srv.Client(t), kbstore.Options{Prefix: testenv.KeyPrefix(t)})
	emb := embed.NewLocal(embed.LocalOptions{})
	live, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: emb.Model(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return fixture{store: store, ing: &ingest.Ingester{Store: store, Embedder: emb}, live: live, emb: emb}
}

func (f fixture) ask(t *testing.T, kb, q string) retrieval.Result {
	t.Helper()
	vecs, err := f.emb.Embed(context.Background(), []string{q})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.live.Retrieve(context.Background(), retrieval.Query{KB: kb, Text: q, Vector: vecs[0], K: 3})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

var docs = []ingest.Document{
	{ID: "otters", Title: "Sea otters", Text: "Sea otters hold hands while they sleep so that they do not drift apart. They eat sea urchins and crabs."},
	{ID: "volcano", Title: "Volcanoes", Text: "A volcano erupts when magma rises through cracks in the crust. Basalt lava flows are runny and travel far."},
	{ID: "bread", Title: "Sourdough", Text: "Sourdough bread rises with a starter of wild yeast and lactic acid bacteria instead of baker's yeast."},
}

func TestIngestRetrieveReplaceDelete(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	res, err := f.ing.Put(ctx, "facts", docs)
	if err != nil || res.Version != 1 || len(res.Docs) != 3 || !res.Docs[0].Changed || res.Docs[0].Chunks != 1 {
		t.Fatalf("put: %+v %v", res, err)
	}
	got := f.ask(t, "facts", "why do otters hold hands")
	if got.KBVersion != 1 || len(got.Chunks) == 0 || got.Chunks[0].DocID != "otters" {
		t.Fatalf("ask: %+v", got)
	}
	held := got.Chunks[0].ID

	// The same documents again: nothing changes, not even the version.
	res, err = f.ing.Put(ctx, "facts", docs)
	if err != nil || res.Version != 1 || res.Docs[0].Changed {
		t.Fatalf("same put: %+v %v", res, err)
	}

	// Replaced: the next question sees the new text at once.
	res, err = f.ing.Put(ctx, "facts", []ingest.Document{{ID: "otters", Title: "Sea otters", Text: "Sea otters use rocks as tools to crack open shellfish."}})
	if err != nil || res.Version != 2 || !res.Docs[0].Changed {
		t.Fatalf("replace: %+v %v", res, err)
	}
	got = f.ask(t, "facts", "what tools do otters use")
	if got.KBVersion != 2 || !strings.Contains(got.Chunks[0].Text, "rocks") {
		t.Fatalf("after replace: %+v", got)
	}
	// A request holding a chunk of the old revision can still read it.
	old, err := f.live.Lookup(ctx, "facts", 1, []string{held})
	if err != nil || !strings.Contains(old[0].Text, "hold hands") {
		t.Fatalf("lookup of the replaced revision: %+v %v", old, err)
	}

	// Deleted: never retrieved again.
	if v, deleted, err := f.store.Delete(ctx, "facts", "otters"); err != nil || !deleted || v != 3 {
		t.Fatalf("delete: %d %v %v", v, deleted, err)
	}
	got = f.ask(t, "facts", "otters rocks tools shellfish")
	for _, c := range got.Chunks {
		if c.DocID == "otters" {
			t.Fatalf("a deleted document was retrieved: %+v", got)
		}
	}
	if got.KBVersion != 3 {
		t.Fatalf("version %d after the delete", got.KBVersion)
	}
	// A kb whose every document is deleted still exists, empty.
	for _, d := range docs[1:] {
		if _, _, err := f.store.Delete(ctx, "facts", d.ID); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.ask(t, "facts", "volcano"); got.KBVersion != 5 || len(got.Chunks) != 0 {
		t.Fatalf("empty kb: %+v", got)
	}
}

func TestUnknownKB(t *testing.T) {
	f := newFixture(t)
	_, err := f.live.Retrieve(context.Background(), retrieval.Query{KB: "nope", Text: "x", K: 1})
	if !errors.Is(err, retrieval.ErrUnknownKB) {
		t.Fatalf("retrieve from an unknown kb: %v", err)
	}
}

func TestInvalidDocumentsRefusedBeforeAnyWrite(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for name, batch := range map[string][]ingest.Document{
		"empty text":   {{ID: "a", Text: "  "}},
		"no id":        {{Text: "x"}},
		"hash in id":   {{ID: "a#1", Text: "x"}},
		"duplicate id": {{ID: "a", Text: "x"}, {ID: "a", Text: "y"}},
		"one bad":      {{ID: "good", Text: "fine text"}, {ID: "", Text: "x"}},
	} {
		if _, err := f.ing.Put(ctx, "facts", batch); !errors.Is(err, ingest.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := f.ing.Put(ctx, "bad name!", docs); !errors.Is(err, ingest.ErrInvalid) {
		t.Errorf("bad kb name: %v", err)
	}
	if v, _ := f.store.Version(ctx, "facts"); v != 0 {
		t.Fatalf("version %d after refused puts", v)
	}
}

func TestOtherModelRefused(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.ing.Put(ctx, "facts", docs[:1]); err != nil {
		t.Fatal(err)
	}
	other := &ingest.Ingester{Store: f.store, Embedder: embed.NewLocal(embed.LocalOptions{Dims: 64})}
	if other.Embedder.Model() == f.emb.Model() {
		t.Skip("the local embedder's model name does not name its dimensions")
	}
	if _, err := other.Put(ctx, "facts", docs[1:2]); !errors.Is(err, ingest.ErrInvalid) {
		t.Fatalf("put with another embedder: %v", err)
	}
}

// The retrieval cache over live kbs: an entry holding a document is
// deleted when that document is deleted; an entry of another kb is not.
func TestCacheEntriesOfAChangedDocumentAreDeleted(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	prefix := testenv.KeyPrefix(t)
	cache := retrieval.NewCachedRetriever(f.live, rdb, retrieval.CacheOptions{
		Prefix: prefix, Version: f.emb.Model(), DocIndexKey: f.store.L2DocKey, Logger: quiet})
	for _, kb := range []string{"facts", "other"} {
		if _, err := f.ing.Put(ctx, kb, docs); err != nil {
			t.Fatal(err)
		}
	}
	q := func(kb string) retrieval.Query {
		vecs, _ := f.emb.Embed(ctx, []string{"why do otters hold hands"})
		return retrieval.Query{KB: kb, Text: "why do otters hold hands", Vector: vecs[0], K: 2}
	}
	for _, kb := range []string{"facts", "other"} {
		if res, hit, err := cache.Get(ctx, q(kb)); err != nil || hit || res.Chunks[0].DocID != "otters" {
			t.Fatalf("%s: first get %+v %v %v", kb, res, hit, err)
		}
		if _, hit, _ := cache.Get(ctx, q(kb)); !hit {
			t.Fatalf("%s: second get missed", kb)
		}
	}
	facts := cache.Key(q("facts"), 1)
	other := cache.Key(q("other"), 1)
	if _, _, err := f.store.Delete(ctx, "facts", "otters"); err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, facts).Val() != 0 {
		t.Fatal("the cache entry holding the deleted document is still stored")
	}
	if rdb.Exists(ctx, other).Val() != 1 {
		t.Fatal("another kb's cache entry was deleted")
	}
	res, hit, err := cache.Get(ctx, q("facts"))
	if err != nil || hit || res.KBVersion != 2 {
		t.Fatalf("after the delete: %+v %v %v", res, hit, err)
	}
	for _, c := range res.Chunks {
		if c.DocID == "otters" {
			t.Fatal("retrieved the deleted document")
		}
	}
}

// Metadata up to the Ingester's byte limit (keys and values together) is
// taken; a byte more is refused naming the limit, before anything is
// embedded or stored.
func TestMetadataBytesAreBounded(t *testing.T) {
	f := newFixture(t)
	f.ing.MaxMetadataBytes = 100
	at := ingest.Document{ID: "m", Text: "Some text.", Metadata: map[string]string{"k": strings.Repeat("v", 99)}}
	if _, err := f.ing.Put(context.Background(), "acme/notes", []ingest.Document{at}); err != nil {
		t.Fatalf("metadata at the limit: %v", err)
	}
	over := ingest.Document{ID: "n", Text: "Some text.", Metadata: map[string]string{"k": strings.Repeat("v", 99), "x": ""}}
	_, err := f.ing.Put(context.Background(), "acme/notes", []ingest.Document{over})
	if !errors.Is(err, ingest.ErrInvalid) || !strings.Contains(err.Error(), "metadata of 101 bytes (keys and values) is over the limit of 100") {
		t.Fatalf("metadata over the limit: %v", err)
	}
	if revs, _ := f.store.Revs(context.Background(), "acme/notes", []string{"n"}); revs[0] != "" {
		t.Fatal("the refused document was stored")
	}
	if (&ingest.Ingester{}).Validate(ingest.Document{ID: "d", Text: "t", Metadata: map[string]string{"k": strings.Repeat("v", ingest.DefaultMaxMetadataBytes)}}) == nil {
		t.Fatal("the default limit let in more than DefaultMaxMetadataBytes")
	}
}
