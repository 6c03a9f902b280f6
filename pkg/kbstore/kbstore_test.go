package kbstore

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

func rev(id, text string, chunks int) Revision {
	r := Revision{ID: id, Title: "T " + id, Dims: 2, Rev: RevisionHash(id, "T "+id, text, nil, "w", "m")}
	for i := range chunks {
		r.Chunks = append(r.Chunks, text)
		r.Vectors = append(r.Vectors, float32(i), float32(len(text)))
	}
	return r
}

func TestPutChangeDelete(t *testing.T) {
	rdb := srv.Client(t)
	s := New(rdb, Options{Prefix: testenv.KeyPrefix(t), Grace: time.Minute})
	ctx := context.Background()

	res, err := s.Put(ctx, "kb", "m", []Revision{rev("a", "alpha", 2), rev("b", "beta", 1)})
	if err != nil || res.Version != 1 || !slices.Equal(res.Changed, []bool{true, true}) {
		t.Fatalf("first put: %+v %v", res, err)
	}
	// The same content again is no change, not even of the version.
	res, err = s.Put(ctx, "kb", "m", []Revision{rev("a", "alpha", 2)})
	if err != nil || res.Version != 1 || res.Changed[0] {
		t.Fatalf("same put: %+v %v", res, err)
	}
	h, changes, err := s.Changes(ctx, "kb", 0)
	if err != nil || h.Version != 1 || h.Epoch == "" || len(changes) != 2 {
		t.Fatalf("changes since 0: %+v %+v %v", h, changes, err)
	}
	epoch := h.Epoch
	revs, err := s.Load(ctx, "kb", changes)
	if err != nil {
		t.Fatal(err)
	}
	a := rev("a", "alpha", 2)
	if revs[0].ID != "a" || !slices.Equal(revs[0].Vectors, a.Vectors) || !slices.Equal(revs[0].Chunks, a.Chunks) {
		t.Fatalf("loaded %+v", revs[0])
	}

	// A retrieval-cache entry holding a, and one holding only b, with the
	// kb's hash tag; and one holding a from before cache keys had it,
	// which is left to expire (on a cluster it may be in another slot).
	p := testenv.KeyPrefix(t)
	for key, doc := range map[string]string{p + "ret:{kb}:1": "a", p + "ret:{kb}:2": "b", p + "ret:kb:1": "a"} {
		rdb.Set(ctx, key, "x", time.Minute)
		rdb.SAdd(ctx, s.L2DocKey("kb", doc), key)
	}
	// Replacing a: one new version, the old revision kept for the grace
	// period, the cache entries holding a gone, the others kept.
	a2 := rev("a", "alpha two", 1)
	res, err = s.Put(ctx, "kb", "m", []Revision{a2})
	if err != nil || res.Version != 2 || !res.Changed[0] {
		t.Fatalf("replace: %+v %v", res, err)
	}
	if ttl := rdb.PTTL(ctx, s.revKey("kb", "a", a.Rev)).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("replaced revision ttl %v, want the grace period", ttl)
	}
	if rdb.Exists(ctx, p+"ret:{kb}:1").Val() != 0 || rdb.Exists(ctx, p+"ret:{kb}:2").Val() != 1 || rdb.Exists(ctx, p+"ret:kb:1").Val() != 1 {
		t.Fatal("replacing a must delete exactly the cache entries of the kb's tag that held it")
	}
	h, changes, _ = s.Changes(ctx, "kb", 1)
	if h.Version != 2 || h.Epoch != epoch || !slices.Equal(changes, []Change{{ID: "a", Rev: a2.Rev}}) {
		t.Fatalf("changes since 1: %+v %+v", h, changes)
	}
	if _, err := s.Load(ctx, "kb", []Change{{ID: "a", Rev: a.Rev}}); err != nil {
		t.Fatalf("the replaced revision within its grace period: %v", err)
	}

	v, deleted, err := s.Delete(ctx, "kb", "b")
	if err != nil || !deleted || v != 3 {
		t.Fatalf("delete: %d %v %v", v, deleted, err)
	}
	if rdb.Exists(ctx, p+"ret:{kb}:2").Val() != 0 {
		t.Fatal("deleting b left a cache entry that held it")
	}
	if v, deleted, _ := s.Delete(ctx, "kb", "b"); deleted || v != 3 {
		t.Fatalf("second delete: %d %v", v, deleted)
	}
	h, changes, _ = s.Changes(ctx, "kb", 2)
	if h.Version != 3 || !slices.Equal(changes, []Change{{ID: "b"}}) {
		t.Fatalf("changes since 2: %+v %+v", h, changes)
	}
	if h, changes, _ := s.Changes(ctx, "kb", 3); h.Version != 3 || len(changes) != 0 {
		t.Fatalf("changes since the current version: %+v %+v", h, changes)
	}
	if h, err := s.Head(ctx, "kb"); err != nil || h != (Head{Version: 3, Epoch: epoch}) {
		t.Fatalf("head %+v %v, want version 3 of epoch %s", h, err, epoch)
	}

	info, err := s.Info(ctx, "kb", Page{Limit: 100})
	if err != nil || info.Version != 3 || info.Model != "m" || info.Chunks != 1 || len(info.Documents) != 1 {
		t.Fatalf("info %+v %v", info, err)
	}
	if d := info.Documents[0]; d.ID != "a" || d.Rev != a2.Rev || d.Chunks != 1 || d.Version != 2 {
		t.Fatalf("doc info %+v", d)
	}
	if names, _ := s.KBs(ctx, ""); !slices.Equal(names, []string{"kb"}) {
		t.Fatalf("kbs %v", names)
	}
	if revs, _ := s.Revs(ctx, "kb", []string{"a", "b"}); !slices.Equal(revs, []string{a2.Rev, ""}) {
		t.Fatalf("revs %v", revs)
	}
}

// Two tenants' kbs of one name, and the shared kb of that name, are three
// kbs: their own versions, documents and name lists.
func TestTenantsKBsAreApart(t *testing.T) {
	s := New(srv.Client(t), Options{Prefix: testenv.KeyPrefix(t)})
	ctx := context.Background()
	acme, globex, shared := kbref.Own("acme", "docs").Key(), kbref.Own("globex", "docs").Key(), kbref.Shared("docs").Key()
	if _, err := s.Put(ctx, acme, "m", []Revision{rev("a", "alpha", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, acme, "m", []Revision{rev("b", "beta", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, globex, "other-model", []Revision{rev("c", "gamma", 1)}); err != nil {
		t.Fatalf("another tenant's kb of the same name is another kb, with its own model: %v", err)
	}
	for kb, want := range map[string]int64{acme: 2, globex: 1, shared: 0} {
		if v, _ := s.Version(ctx, kb); v != want {
			t.Errorf("version of %s = %d, want %d", kb, v, want)
		}
	}
	if info, _ := s.Info(ctx, globex, Page{Limit: 10}); len(info.Documents) != 1 || info.Documents[0].ID != "c" {
		t.Fatalf("globex sees %+v", info.Documents)
	}
	if _, _, err := s.Delete(ctx, globex, "a"); err != nil {
		t.Fatal(err)
	}
	if revs, _ := s.Revs(ctx, acme, []string{"a"}); revs[0] == "" {
		t.Fatal("a delete in globex's kb removed acme's document")
	}
	for tenant, want := range map[string][]string{"acme": {"docs"}, "globex": {"docs"}, "": nil, "initech": nil} {
		if names, err := s.KBs(ctx, tenant); err != nil || !slices.Equal(names, want) {
			t.Errorf("kbs of %q = %v %v, want %v", tenant, names, err, want)
		}
	}
}

func TestModelMismatchRefused(t *testing.T) {
	s := New(srv.Client(t), Options{Prefix: testenv.KeyPrefix(t)})
	ctx := context.Background()
	if _, err := s.Put(ctx, "kb", "m", []Revision{rev("a", "alpha", 1)}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Put(ctx, "kb", "other", []Revision{rev("b", "beta", 1)})
	if !errors.Is(err, ErrModelMismatch) {
		t.Fatalf("put with another model: %v", err)
	}
	if v, _ := s.Version(ctx, "kb"); v != 1 {
		t.Fatalf("version %d after a refused put", v)
	}
}

func TestGoneRevision(t *testing.T) {
	s := New(srv.Client(t), Options{Prefix: testenv.KeyPrefix(t), Grace: time.Millisecond})
	ctx := context.Background()
	a := rev("a", "alpha", 1)
	s.Put(ctx, "kb", "m", []Revision{a})
	s.Delete(ctx, "kb", "a")
	time.Sleep(20 * time.Millisecond)
	if _, err := s.Load(ctx, "kb", []Change{{ID: "a", Rev: a.Rev}}); !errors.Is(err, ErrGone) {
		t.Fatalf("load after the grace period: %v", err)
	}
}

func TestBadRevisionsRefused(t *testing.T) {
	s := New(srv.Client(t), Options{Prefix: testenv.KeyPrefix(t)})
	bad := rev("a", "alpha", 2)
	bad.Vectors = bad.Vectors[:3]
	for _, r := range []Revision{bad, rev("", "x", 1), rev("a#1", "x", 1), rev("a", "x", 0)} {
		if _, err := s.Put(context.Background(), "kb", "m", []Revision{r}); err == nil {
			t.Fatalf("put of %+v succeeded", r)
		}
	}
}

// A kb written again after its keys vanished (Redis restarted empty)
// counts from version 1 in a new epoch.
func TestNewEpochAfterTheKBVanished(t *testing.T) {
	rdb := srv.Client(t)
	s := New(rdb, Options{Prefix: testenv.KeyPrefix(t), Grace: time.Minute})
	ctx := context.Background()
	if _, err := s.Put(ctx, "kb", "m", []Revision{rev("a", "alpha", 2)}); err != nil {
		t.Fatal(err)
	}
	before, err := s.Head(ctx, "kb")
	if err != nil || before.Version != 1 || before.Epoch == "" {
		t.Fatalf("head %+v %v", before, err)
	}
	keys, _ := rdb.Keys(ctx, s.kbPrefix("kb")+"*").Result()
	rdb.Del(ctx, keys...)
	if h, err := s.Head(ctx, "kb"); err != nil || h != (Head{}) {
		t.Fatalf("head of a vanished kb %+v %v", h, err)
	}
	time.Sleep(2 * time.Millisecond) // TIME moves on
	if _, err := s.Put(ctx, "kb", "m", []Revision{rev("a", "alpha", 2)}); err != nil {
		t.Fatal(err)
	}
	after, err := s.Head(ctx, "kb")
	if err != nil || after.Version != 1 || after.Epoch == before.Epoch {
		t.Fatalf("head %+v after %+v: want version 1 in a new epoch", after, before)
	}
}

// A kb's usage follows its documents exactly through adds, replacements,
// unchanged re-ingests and deletes.
func TestUsageFollowsTheDocuments(t *testing.T) {
	rdb := srv.Client(t)
	s := New(rdb, Options{Prefix: testenv.KeyPrefix(t), Grace: time.Minute})
	ctx := context.Background()
	want := func(docs, bytes int64) {
		t.Helper()
		u, err := s.Usage(ctx, "acme/notes")
		if err != nil || u != (Usage{Documents: docs, Bytes: bytes}) {
			t.Fatalf("usage %+v %v, want %d documents, %d bytes", u, err, docs, bytes)
		}
	}
	want(0, 0)
	a, b := rev("a", "alpha", 2), rev("b", "beta", 1)
	if _, err := s.Put(ctx, "acme/notes", "m", []Revision{a, b}); err != nil {
		t.Fatal(err)
	}
	want(2, a.Bytes()+b.Bytes())
	if _, err := s.Put(ctx, "acme/notes", "m", []Revision{a}); err != nil { // unchanged
		t.Fatal(err)
	}
	want(2, a.Bytes()+b.Bytes())
	a2 := rev("a", "alpha, longer now", 3)
	if _, err := s.Put(ctx, "acme/notes", "m", []Revision{a2}); err != nil {
		t.Fatal(err)
	}
	want(2, a2.Bytes()+b.Bytes())
	if _, _, err := s.Delete(ctx, "acme/notes", "b"); err != nil {
		t.Fatal(err)
	}
	want(1, a2.Bytes())
	if _, _, err := s.Delete(ctx, "acme/notes", "b"); err != nil { // gone already
		t.Fatal(err)
	}
	want(1, a2.Bytes())
}

// A document's metadata is stored once, in its info (what reads of the kb
// return), not again in its revision's record, and counts in its kb's
// usage; a record written with metadata, as before, still loads.
func TestMetadataIsStoredOnceAndCounted(t *testing.T) {
	rdb := srv.Client(t)
	s := New(rdb, Options{Prefix: testenv.KeyPrefix(t), Grace: time.Minute})
	ctx := context.Background()
	a := rev("a", "alpha", 1)
	a.Metadata = map[string]string{"source": strings.Repeat("s", 1000)}
	if _, err := s.Put(ctx, "acme/notes", "m", []Revision{a}); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.Usage(ctx, "acme/notes"); u.Bytes != a.Bytes() || a.Bytes() < 1006 {
		t.Fatalf("usage %+v, want %d bytes with the metadata's 1006", u, a.Bytes())
	}
	meta := rdb.HGet(ctx, s.revKey("acme/notes", "a", a.Rev), "meta").Val()
	if strings.Contains(meta, "sss") || meta == "" {
		t.Fatalf("the revision's record holds the metadata again: %.120s", meta)
	}
	info, err := s.Info(ctx, "acme/notes", Page{Limit: 10})
	if err != nil || len(info.Documents) != 1 || info.Documents[0].Metadata["source"] != a.Metadata["source"] {
		t.Fatalf("info %+v %v", info, err)
	}
	old := `{"id":"a","rev":"` + a.Rev + `","title":"T a","metadata":{"k":"v"},"chunks":["alpha"],"dims":2}`
	rdb.HSet(ctx, s.revKey("acme/notes", "a", a.Rev), "meta", old)
	got, err := s.Load(ctx, "acme/notes", []Change{{ID: "a", Rev: a.Rev}})
	if err != nil || len(got) != 1 || got[0].Chunks[0] != "alpha" {
		t.Fatalf("a record with metadata loads as %+v, %v", got, err)
	}
}

// Pages walk a kb's documents in id order, each once, with the whole kb's
// counts on every page; the chunk total follows puts, replacements and
// deletes.
func TestInfoPages(t *testing.T) {
	s := New(srv.Client(t), Options{Prefix: testenv.KeyPrefix(t), Grace: time.Minute})
	ctx := context.Background()
	var revs []Revision
	for _, id := range []string{"e", "a", "d", "b", "c"} {
		revs = append(revs, rev(id, "text of "+id, 2))
	}
	if _, err := s.Put(ctx, "kb", "m", revs); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "kb", "m", []Revision{rev("c", "c, now in three chunks", 3)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Delete(ctx, "kb", "d"); err != nil {
		t.Fatal(err)
	}
	var got []string
	after := ""
	for range 10 {
		info, err := s.Info(ctx, "kb", Page{After: after, Limit: 2})
		if err != nil || info.DocumentCount != 4 || info.Chunks != 9 || len(info.Documents) > 2 || info.Version != 3 {
			t.Fatalf("page after %q: %+v %v", after, info, err)
		}
		for _, d := range info.Documents {
			got = append(got, d.ID)
		}
		if after = info.Next; after == "" {
			break
		}
	}
	if !slices.Equal(got, []string{"a", "b", "c", "e"}) {
		t.Fatalf("pages gave %v", got)
	}
	if info, err := s.Info(ctx, "kb", Page{After: "e", Limit: 2}); err != nil || len(info.Documents) != 0 || info.Next != "" {
		t.Fatalf("a page after the last: %+v %v", info, err)
	}
	if _, err := s.Info(ctx, "kb", Page{}); err == nil {
		t.Fatal("a page of no documents was read")
	}
}

// A kb written before it had its ids set and chunk total (only docs and
// info) is indexed once, by the first read or write that touches it.
func TestAnOlderKBIsIndexedOnce(t *testing.T) {
	rdb := srv.Client(t)
	s := New(rdb, Options{Prefix: testenv.KeyPrefix(t), Grace: time.Minute})
	ctx := context.Background()
	if _, err := s.Put(ctx, "kb", "m", []Revision{rev("a", "alpha", 2), rev("b", "beta", 3)}); err != nil {
		t.Fatal(err)
	}
	forget := func() {
		rdb.Del(ctx, s.kbPrefix("kb")+"ids")
		rdb.HDel(ctx, s.kbPrefix("kb")+"usage", "chunks", "indexed")
	}
	forget()
	if info, err := s.Info(ctx, "kb", Page{Limit: 10}); err != nil || info.Chunks != 5 || len(info.Documents) != 2 {
		t.Fatalf("an older kb read as %+v %v", info, err)
	}
	forget()
	if _, err := s.Put(ctx, "kb", "m", []Revision{rev("a", "alpha again", 1), rev("c", "gamma", 1)}); err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx, "kb", Page{Limit: 10}); err != nil || info.Chunks != 5 || info.DocumentCount != 3 || len(info.Documents) != 3 {
		t.Fatalf("an older kb written to reads as %+v %v", info, err)
	}
	forget()
	if _, _, err := s.Delete(ctx, "kb", "b"); err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx, "kb", Page{Limit: 10}); err != nil || info.Chunks != 2 || len(info.Documents) != 2 {
		t.Fatalf("an older kb deleted from reads as %+v %v", info, err)
	}
}

// A put that would take a kb past MaxKBMemory is refused whole, naming
// what the kb would need; one that shrinks it, and a delete, are taken,
// and the kb's memory usage follows every change.
func TestPutRefusesAKBPastMaxMemory(t *testing.T) {
	rdb := srv.Client(t)
	s := New(rdb, Options{Prefix: testenv.KeyPrefix(t), Grace: time.Minute, MaxKBMemory: 1000})
	ctx := context.Background()
	sized := func(id, text string, memory int64) Revision {
		r := rev(id, text, 1)
		r.Memory = memory
		return r
	}
	memory := func() int64 {
		t.Helper()
		u, err := s.Usage(ctx, "kb")
		if err != nil {
			t.Fatal(err)
		}
		return u.Memory
	}
	if _, err := s.Put(ctx, "kb", "m", []Revision{sized("a", "alpha", 400), sized("b", "beta", 500)}); err != nil {
		t.Fatal(err)
	}
	if got := memory(); got != 900 {
		t.Fatalf("memory %d after the first put, want 900", got)
	}
	// 900 + 200 (c) + 50 (a grows) is past 1000: nothing of the batch
	// is stored.
	_, err := s.Put(ctx, "kb", "m", []Revision{sized("c", "gamma", 200), sized("a", "alpha2", 450)})
	var tl *TooLarge
	if !errors.Is(err, ErrTooLarge) || !errors.As(err, &tl) || tl.Memory != 1150 || tl.Max != 1000 {
		t.Fatalf("put past the limit: %v (%+v)", err, tl)
	}
	if v, _ := s.Version(ctx, "kb"); v != 1 {
		t.Fatalf("version %d after a refused put, want 1", v)
	}
	if got := memory(); got != 900 {
		t.Fatalf("memory %d after a refused put, want 900", got)
	}
	// Replacing a with a smaller revision shrinks the kb: taken, though
	// it adds a document.
	if _, err := s.Put(ctx, "kb", "m", []Revision{sized("a", "alpha3", 100), sized("c", "gamma", 200)}); err != nil {
		t.Fatalf("put that shrinks the kb: %v", err)
	}
	if got := memory(); got != 800 {
		t.Fatalf("memory %d, want 800", got)
	}
	if _, _, err := s.Delete(ctx, "kb", "b"); err != nil {
		t.Fatal(err)
	}
	if got := memory(); got != 300 {
		t.Fatalf("memory %d after deleting b, want 300", got)
	}
	// Up to the limit exactly is within it.
	if _, err := s.Put(ctx, "kb", "m", []Revision{sized("d", "delta", 700)}); err != nil {
		t.Fatalf("put up to the limit: %v", err)
	}
	if got := memory(); got != 1000 {
		t.Fatalf("memory %d, want 1000", got)
	}
}

// Reading or deleting from a kb that does not exist writes nothing: a
// client asking for names that do not exist must not leave keys behind
// (each lookup of a missing kb once left a usage hash that never
// expired).
func TestLookupsOfAMissingKBWriteNothing(t *testing.T) {
	rdb := srv.Client(t)
	prefix := testenv.KeyPrefix(t)
	s := New(rdb, Options{Prefix: prefix, Grace: time.Minute})
	ctx := context.Background()
	keys := func() []string {
		got, err := rdb.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, kb := range []string{"missing", "other"} {
		if info, err := s.Info(ctx, kb, Page{Limit: 10}); err != nil || info.Version != 0 || len(info.Documents) != 0 {
			t.Fatalf("info of a missing kb: %+v %v", info, err)
		}
		if _, deleted, err := s.Delete(ctx, kb, "doc"); err != nil || deleted {
			t.Fatalf("delete from a missing kb: deleted %v, %v", deleted, err)
		}
	}
	if got := keys(); len(got) != 0 {
		t.Fatalf("lookups of missing kbs wrote %v", got)
	}

	// An emptied kb reads as empty, with its version, and a delete of a
	// document it never had changes nothing.
	if _, err := s.Put(ctx, "kb", "m", []Revision{rev("a", "alpha", 2)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Delete(ctx, "kb", "a"); err != nil {
		t.Fatal(err)
	}
	before := keys()
	if info, err := s.Info(ctx, "kb", Page{Limit: 10}); err != nil || info.Version != 2 || info.Model != "m" || info.DocumentCount != 0 || info.Chunks != 0 {
		t.Fatalf("an emptied kb reads as %+v %v", info, err)
	}
	if v, deleted, err := s.Delete(ctx, "kb", "never"); err != nil || deleted || v != 2 {
		t.Fatalf("delete of a document never held: version %d deleted %v %v", v, deleted, err)
	}
	if after := keys(); !slices.Equal(sorted(after), sorted(before)) {
		t.Fatalf("reads of an emptied kb changed its keys: %v, was %v", after, before)
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }
