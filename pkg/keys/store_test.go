package keys

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

// freshPrefix is the test's key space, emptied of what an earlier run
// (-count) left.
func freshPrefix(t *testing.T) string {
	t.Helper()
	prefix := testenv.KeyPrefix(t)
	rdb := srv.Client(t)
	if old, _ := rdb.Keys(context.Background(), prefix+"*").Result(); len(old) > 0 {
		rdb.Del(context.Background(), old...)
	}
	return prefix
}

func TestPlainKeyShape(t *testing.T) {
	id, plain, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseID(plain)
	if err != nil || got != id {
		t.Fatalf("ParseID(%s) = %q, %v; want %q", plain, got, err, id)
	}
	for _, bad := range []string{"", "k-acme", "sk_", "sk_" + id, "sk_" + id + "_short", "sk_ABCDEFGHIJKL_" + strings.Repeat("a", 52), "xk_" + plain[3:]} {
		if _, err := ParseID(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseID(%q) = %v, want ErrMalformed", bad, err)
		}
	}
	if m := Mask(id); strings.Contains(plain, m) || !strings.HasPrefix(m, "sk_"+id) {
		t.Errorf("Mask(%s) = %s", id, m)
	}
}

func TestCreateGetListRevoke(t *testing.T) {
	rdb := srv.Client(t)
	ctx := context.Background()
	s := NewStore(rdb, freshPrefix(t))
	plain, k, err := s.Create(ctx, Spec{Tenant: "acme", User: "alice", Tier: "vip", Scopes: Scopes{ScopeChat, ScopeIngest}})
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := ParseID(plain); id != k.ID || k.CreatedAt.IsZero() {
		t.Fatalf("created %+v from %s", k, plain)
	}
	if _, _, err := s.Create(ctx, Spec{Tenant: "other", Scopes: Scopes{ScopeAdmin}}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Get(ctx, k.ID)
	if err != nil || !ok || got.Tenant != "acme" || got.User != "alice" || got.Tier != "vip" || got.Scopes.String() != "chat,ingest" || got.hash != Hash(plain) {
		t.Fatalf("Get = %+v %v %v", got, ok, err)
	}
	// Redis holds the hash, never the key or its secret.
	all, _ := rdb.Keys(ctx, testenv.KeyPrefix(t)+"*").Result()
	for _, key := range all {
		dump, _ := rdb.Dump(ctx, key).Result()
		if strings.Contains(dump, plain[16:]) {
			t.Fatalf("%s holds the key's secret", key)
		}
	}

	if err := s.Touch(ctx, k.ID, time.UnixMilli(1_800_000_000_000)); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx, "acme")
	if err != nil || len(list) != 1 || list[0].ID != k.ID || list[0].LastUsedAt.UnixMilli() != 1_800_000_000_000 {
		t.Fatalf("List(acme) = %+v %v", list, err)
	}
	if list, _ := s.List(ctx, ""); len(list) != 2 {
		t.Fatalf("List() = %d keys, want 2", len(list))
	}

	ps := rdb.Subscribe(ctx, s.Channel())
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // a second revoke is no error, and announces again
		if ok, err := s.Revoke(ctx, k.ID); !ok || err != nil {
			t.Fatalf("revoke #%d: %v %v", i, ok, err)
		}
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil || msg.Payload != k.ID {
			t.Fatalf("announcement %+v %v", msg, err)
		}
	}
	got, _, _ = s.Get(ctx, k.ID)
	if !got.Revoked || got.RevokedAt.IsZero() {
		t.Fatalf("after revoke: %+v", got)
	}
	if ok, err := s.Revoke(ctx, "aaaaaaaaaaaa"); ok || err != nil {
		t.Fatalf("revoke unknown: %v %v", ok, err)
	}
}

// create.lua refuses an id already taken, so a collision draws again
// instead of overwriting another tenant's key.
func TestCreateScriptRefusesATakenID(t *testing.T) {
	rdb := srv.Client(t)
	ctx := context.Background()
	s := NewStore(rdb, freshPrefix(t))
	run := func(hash string) int64 {
		n, err := createScript.Run(ctx, rdb, []string{s.recordKey("aaaaaaaaaaaa"), s.idsKey()}, "aaaaaaaaaaaa", hash, "t", "", "", "chat").Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if run("first") <= 0 {
		t.Fatal("first create refused")
	}
	if run("second") != 0 {
		t.Fatal("second create with the same id accepted")
	}
	if h, _ := rdb.HGet(ctx, s.recordKey("aaaaaaaaaaaa"), "hash").Result(); h != "first" {
		t.Fatalf("record overwritten: hash %q", h)
	}
}

func TestSpecIsChecked(t *testing.T) {
	for _, sp := range []Spec{
		{Tenant: "", Scopes: Scopes{ScopeChat}},
		{Tenant: "a b", Scopes: Scopes{ScopeChat}},
		{Tenant: "acme", User: "x/y", Scopes: Scopes{ScopeChat}},
		{Tenant: "acme"},
		{Tenant: "acme", Scopes: Scopes{"root"}},
		{Tenant: "acme", Scopes: Scopes{ScopeChat, ScopeChat}},
	} {
		if err := sp.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", sp, err)
		}
	}
}
