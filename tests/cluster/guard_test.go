package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/keys"
)

// The ban script with both of a request's subjects, in different slots,
// until one is banned; the index lists it; Lift's transaction.
func TestBans(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	g, err := ban.New(rdb, ban.Options{KeyPrefix: prefix, Threshold: 3, Window: 10 * time.Second, Duration: time.Minute})
	ok(t, "new guard", err)
	ip, key := g.IP("203.0.113.9"), ban.Subject{Kind: ban.KindKey, Value: "abcdefghijkl"}
	var v ban.Verdict
	for i := range 5 {
		v, err = g.Strike(ctx, ip, key)
		ok(t, "hit", err)
		if v.Banned {
			if i != 3 || !v.New || v.Kind != ban.KindIP {
				t.Fatalf("request %d: %+v, want the ip banned by the fourth", i+1, v)
			}
			break
		}
	}
	if !v.Banned {
		t.Fatal("never banned")
	}
	list, err := g.List(ctx)
	ok(t, "list", err)
	if len(list) != 1 || list[0].Kind != ban.KindIP {
		t.Fatalf("bans %+v, want the ip's", list)
	}
	lifted, err := g.Lift(ctx, ip)
	ok(t, "lift", err)
	if !lifted {
		t.Fatal("lift found no ban")
	}
	if list, err := g.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("bans after the lift %+v %v", list, err)
	}
}

// The managed keys' create and revoke scripts, and the list's pipeline.
func TestKeys(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	s := keys.NewStore(rdb, prefix)
	_, k, err := s.Create(ctx, keys.Spec{Tenant: "acme", User: "alice", Tier: "free", Scopes: keys.Scopes(keys.AllScopes)})
	ok(t, "create", err)
	ok(t, "touch", s.Touch(ctx, k.ID, time.Now()))
	list, err := s.List(ctx, "acme")
	ok(t, "list", err)
	if len(list) != 1 || list[0].ID != k.ID || list[0].LastUsedAt.IsZero() {
		t.Fatalf("list %+v, want %s used", list, k.ID)
	}
	revoked, err := s.Revoke(ctx, k.ID)
	ok(t, "revoke", err)
	got, found, err := s.Get(ctx, k.ID)
	ok(t, "get", err)
	if !revoked || !found || !got.Revoked {
		t.Fatalf("after revoke %v: %+v found %v", revoked, got, found)
	}
}

// The idempotency key's claim and its release script.
func TestIdempotency(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	s := idempotency.New(rdb, prefix, time.Minute)
	k, err := s.KeyFor("acme", "alice", "retry-1", idempotency.Fingerprint([]byte("body")))
	ok(t, "key", err)
	_, won, err := s.Claim(ctx, k, "req-1")
	ok(t, "claim", err)
	ok(t, "release", s.Release(ctx, k, "req-1"))
	if _, found, err := s.Lookup(ctx, k); !won || found || err != nil {
		t.Fatalf("won %v, still held %v (%v) after the release", won, found, err)
	}
}
