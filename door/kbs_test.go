package door_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// doc is a stored document of one chunk of text.
func doc(id, text string) kbstore.Revision {
	return kbstore.Revision{ID: id, Rev: id + "-r1", Title: id, Chunks: []string{text}, Vectors: []float32{1}, Dims: 1}
}

// A name means the shared kb of that name if there is one, else the
// caller's tenant's own; another tenant's kb cannot be named.
func TestKBsResolve(t *testing.T) {
	s := newStack(t, nil)
	globex := acme
	globex.Tenant = "globex"
	for _, c := range []struct {
		who  door.Caller
		name string
		want kbref.Ref
	}{
		{acme, "sluice-docs", kbref.Shared("sluice-docs")},
		{globex, "sluice-docs", kbref.Shared("sluice-docs")},
		{acme, "handbook", kbref.Own("acme", "handbook")},
		{globex, "handbook", kbref.Own("globex", "handbook")},
		{acme, "globex/handbook", kbref.Own("acme", "globex/handbook")},
	} {
		if got := s.door.KBs().Resolve(c.who, c.name); got != c.want {
			t.Errorf("%s's %q resolves to %+v, want %+v", c.who.Tenant, c.name, got, c.want)
		}
	}
	if !s.door.KBs().IsShared("sluice-docs") || s.door.KBs().IsShared("handbook") || !slices.Equal(s.door.KBs().Shared(), []string{"sluice-docs"}) {
		t.Errorf("shared kbs %v", s.door.KBs().Shared())
	}
}

// A write names a kb the caller may change: its tenant's own, with a key
// that holds the ingest scope, by a valid name.
func TestKBsWritable(t *testing.T) {
	s := newStack(t, nil)
	ingester := acme
	ingester.Scopes = keys.Scopes{keys.ScopeChat, keys.ScopeIngest}
	cases := []struct {
		name, kb string
		who      door.Caller
		want     kbref.Ref
		class    refusal.Class
		code     string
	}{
		{"its own kb", "handbook", ingester, kbref.Own("acme", "handbook"), 0, ""},
		{"a shared kb is read-only", "sluice-docs", ingester, kbref.Ref{}, refusal.Forbidden, "kb_read_only"},
		{"a key without the ingest scope", "handbook", acme, kbref.Ref{}, refusal.Forbidden, "missing_scope"},
		{"a name with a slash", "globex/handbook", ingester, kbref.Ref{}, refusal.Invalid, "bad_kb"},
		{"an empty name", "", ingester, kbref.Ref{}, refusal.Invalid, "bad_kb"},
		{"a name too long", strings.Repeat("k", 65), ingester, kbref.Ref{}, refusal.Invalid, "bad_kb"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := s.door.KBs().Writable(c.who, c.kb)
			if c.code == "" {
				if err != nil || got != c.want {
					t.Fatalf("writable %+v, %v; want %+v", got, err, c.want)
				}
				return
			}
			e := refusalOf(t, err)
			if e.Class != c.class || e.Code != c.code || got != (kbref.Ref{}) {
				t.Fatalf("refused %v %s with %+v, want %v %s", e.Class, e.Code, got, c.class, c.code)
			}
		})
	}
	if err := door.CheckName("ok.name_1-2"); err != nil {
		t.Errorf("a valid name refused: %v", err)
	}
}

// Known says whether a chat may name a kb: a configured kb always, even
// while Redis lacks it; a tenant's kb once written. A yes is remembered
// (a kb is never removed); a no is not.
func TestKBsKnown(t *testing.T) {
	s := newStack(t, nil)
	ctx := context.Background()
	known := func(kb kbref.Ref) bool {
		t.Helper()
		ok, err := s.door.KBs().Known(ctx, kb)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !known(kbref.Shared("sluice-docs")) {
		t.Error("the configured kb is unknown while Redis lacks it")
	}
	if known(kbref.Shared("elsewhere")) {
		t.Error("a shared kb nobody configured is known")
	}
	mine := kbref.Own("acme", "handbook")
	if known(mine) {
		t.Fatal("a kb never written is known")
	}
	putDocs(t, s, mine, doc("d1", "text"))
	if !known(mine) {
		t.Fatal("a written kb is unknown: the no was remembered")
	}
	if known(kbref.Own("globex", "handbook")) {
		t.Error("another tenant's kb of the same name is known")
	}
	// Redis lost the kb: the yes stands.
	if err := s.rdb.Del(ctx, s.kbs.VersionKey(mine.Key())).Err(); err != nil {
		t.Fatal(err)
	}
	if !known(mine) {
		t.Error("a kb known once is forgotten")
	}
	if known(kbref.Own("acme", "not/valid")) {
		t.Error("an invalid name is known")
	}
}

// Known fails closed: a kb store that cannot be read is an error, which
// the chat answers as unavailable, not as an unknown kb.
func TestUnknownKBWhileTheStoreIsDownIsUnavailable(t *testing.T) {
	s := newStack(t, nil)
	if err := s.rdb.Set(context.Background(), s.kbs.VersionKey(kbref.Own("acme", "handbook").Key()), "not a number", 0).Err(); err != nil {
		t.Fatal(err)
	}
	req := s.request("hello", 16)
	req.KB = "handbook"
	_, err := s.door.Admit(context.Background(), acme, req)
	if e := refusalOf(t, err); e.Class != refusal.Unavailable || e.Code != "unavailable" {
		t.Fatalf("refused %+v, want unavailable", e)
	}
}

// Readable lists the shared kbs and the caller's own, sorted; an own kb
// whose name is now a shared kb's is out of reach.
func TestKBsReadable(t *testing.T) {
	s := newStack(t, nil)
	for _, name := range []string{"zeta", "alpha", "sluice-docs"} {
		putDocs(t, s, kbref.Own("acme", name), doc("d1", "text"))
	}
	putDocs(t, s, kbref.Own("globex", "secret"), doc("d1", "text"))
	got, err := s.door.KBs().Readable(context.Background(), acme)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"alpha", "sluice-docs", "zeta"}; !slices.Equal(got, want) {
		t.Fatalf("readable %v, want %v", got, want)
	}
}

// A batch that would take the tenant past its tier's ingestion quota, in
// documents (new ones only) or bytes, across its own kbs, is refused.
func TestCheckIngestQuota(t *testing.T) {
	s := newStack(t, func(c *config.Config) {
		setTier(c, func(t *policy.Tier) { t.IngestQuota = policy.IngestQuota{Documents: 3, Bytes: 2000} })
		unlimited := meteredTier()
		c.Limits.Tiers["unlimited"] = unlimited
	})
	// Two documents stored, one in each of acme's kbs; globex's and the
	// shared kb's count for nobody's quota here.
	kb1, kb2 := kbref.Own("acme", "kb1"), kbref.Own("acme", "kb2")
	putDocs(t, s, kb1, doc("d1", "first"))
	putDocs(t, s, kb2, doc("d2", "second"))
	putDocs(t, s, kbref.Own("globex", "kb1"), doc("g1", "g"), doc("g2", "g"), doc("g3", "g"))
	putDocs(t, s, kbref.Shared("sluice-docs"), doc("s1", "s"), doc("s2", "s"))
	newDoc := func(id string, size int) ingest.Document {
		return ingest.Document{ID: id, Title: id, Text: strings.Repeat("x", size)}
	}
	unlimited := acme
	unlimited.Tier = "unlimited"
	cases := []struct {
		name   string
		who    door.Caller
		docs   []ingest.Document
		refuse string
	}{
		{"one new document fits", acme, []ingest.Document{newDoc("d3", 10)}, ""},
		{"two new documents pass the count", acme, []ingest.Document{newDoc("d3", 10), newDoc("d4", 10)},
			"2 documents stored and 2 new ones would pass the plan's 3"},
		{"a new revision of a stored document is not a new one", acme, []ingest.Document{newDoc("d1", 10), newDoc("d3", 10)}, ""},
		{"a document too large passes the bytes", acme, []ingest.Document{newDoc("d3", 2000)}, "bytes stored and about"},
		{"a tier without a quota", unlimited, []ingest.Document{newDoc("d3", 5000), newDoc("d4", 1), newDoc("d5", 1)}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.door.CheckIngestQuota(context.Background(), c.who, kb1, c.docs)
			if c.refuse == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			e := refusalOf(t, err)
			if e.Class != refusal.Forbidden || e.Code != "ingest_quota_exceeded" || !strings.Contains(e.Message, c.refuse) {
				t.Fatalf("refused %+v, want ingest_quota_exceeded saying %q", e, c.refuse)
			}
		})
	}
}
