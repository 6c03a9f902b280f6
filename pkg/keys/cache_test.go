package keys

import (
	"context"
	"errors"
	"testing"
	"time"
)

// runCache starts a cache's subscription and waits until it is trusted.
func runCache(t *testing.T, c *Cache) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(5 * time.Second)
	for !c.Live() {
		if time.Now().After(deadline) {
			t.Fatal("cache never subscribed")
		}
		time.Sleep(time.Millisecond)
	}
}

// Two API processes share one Redis: a key revoked through one stops
// working on the other within a second, though the other had it cached.
func TestRevocationReachesEveryCacheWithinASecond(t *testing.T) {
	ctx := context.Background()
	prefix := freshPrefix(t)
	a := NewCache(NewStore(srv.Client(t), prefix), CacheOptions{TTL: time.Hour})
	b := NewCache(NewStore(srv.Client(t), prefix), CacheOptions{TTL: time.Hour})
	runCache(t, a)
	runCache(t, b)
	plain, k, err := a.Store().Create(ctx, Spec{Tenant: "acme", Scopes: Scopes{ScopeChat}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Verify(ctx, plain); err != nil || got.ID != k.ID {
		t.Fatalf("verify on b: %+v %v", got, err)
	}
	if _, ok := b.entries[k.ID]; !ok {
		t.Fatal("b did not cache the key")
	}
	if _, err := a.Store().Revoke(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		_, err := b.Verify(ctx, plain)
		if errors.Is(err, ErrRevoked) {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("b still accepts the key a second after it was revoked: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestVerifyRefusesWrongSecretsAndReadsRedisOncePerTTL(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	c := NewCache(NewStore(rdb, freshPrefix(t)), CacheOptions{TTL: time.Hour})
	runCache(t, c)
	plain, k, err := c.Store().Create(ctx, Spec{Tenant: "acme", Scopes: Scopes{ScopeChat}})
	if err != nil {
		t.Fatal(err)
	}
	wrong := plain[:len(plain)-1] + "a"
	if wrong == plain {
		wrong = plain[:len(plain)-1] + "b"
	}
	if _, err := c.Verify(ctx, wrong); !errors.Is(err, ErrUnknown) {
		t.Fatalf("wrong secret: %v", err)
	}
	if _, err := c.Verify(ctx, "sk_aaaaaaaaaaaa_"+plain[16:]); !errors.Is(err, ErrUnknown) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := c.Verify(ctx, "k-acme"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("not a managed key: %v", err)
	}
	// Cached: with the record gone from Redis the key still verifies from
	// memory until the TTL, which is the point of the cache.
	if _, err := c.Verify(ctx, plain); err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, c.Store().recordKey(k.ID))
	if _, err := c.Verify(ctx, plain); err != nil {
		t.Fatalf("cached key: %v", err)
	}
	c.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if _, err := c.Verify(ctx, plain); !errors.Is(err, ErrUnknown) {
		t.Fatalf("after the TTL the cache must read Redis again: %v", err)
	}
}

// Without its subscription a cache trusts nothing it holds: a revocation
// it cannot hear about is read from Redis.
func TestCacheWithoutItsChannelReadsRedis(t *testing.T) {
	ctx := context.Background()
	c := NewCache(NewStore(srv.Client(t), freshPrefix(t)), CacheOptions{TTL: time.Hour})
	plain, k, err := c.Store().Create(ctx, Spec{Tenant: "acme", Scopes: Scopes{ScopeChat}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if len(c.entries) != 0 {
		t.Fatal("cached without a subscription")
	}
	// Revoked without an announcement this cache could hear.
	srv.Client(t).HSet(ctx, c.Store().recordKey(k.ID), "revoked", time.Now().UnixMilli())
	if _, err := c.Verify(ctx, plain); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked key: %v", err)
	}
}

// A key's last use is written at most once per TouchEvery.
func TestLastUseIsRecordedSparingly(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	c := NewCache(NewStore(rdb, freshPrefix(t)), CacheOptions{TTL: time.Hour, TouchEvery: time.Minute})
	runCache(t, c)
	plain, k, err := c.Store().Create(ctx, Spec{Tenant: "acme", Scopes: Scopes{ScopeChat}})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := c.Verify(ctx, plain); err != nil {
			t.Fatal(err)
		}
	}
	c.active.Wait()
	first, err := rdb.HGet(ctx, c.Store().usedKey(), k.ID).Int64()
	if err != nil || first == 0 {
		t.Fatalf("last use not recorded: %v", err)
	}
	rdb.HSet(ctx, c.Store().usedKey(), k.ID, 1)
	_, _ = c.Verify(ctx, plain)
	c.active.Wait()
	if v, _ := rdb.HGet(ctx, c.Store().usedKey(), k.ID).Int64(); v != 1 {
		t.Fatal("a second use within a minute was written")
	}
	c.now = func() time.Time { return time.Now().Add(61 * time.Second) }
	_, _ = c.Verify(ctx, plain)
	c.active.Wait()
	if v, _ := rdb.HGet(ctx, c.Store().usedKey(), k.ID).Int64(); v <= first {
		t.Fatal("a use a minute later was not written")
	}
}

// A subscription that breaks empties the cache and distrusts it until it
// is back: a revocation announced meanwhile, which it cannot hear, is
// still seen.
func TestBrokenSubscriptionEmptiesTheCache(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	c := NewCache(NewStore(rdb, freshPrefix(t)), CacheOptions{TTL: time.Hour})
	runCache(t, c)
	plain, k, err := c.Store().Create(ctx, Spec{Tenant: "acme", Scopes: Scopes{ScopeChat}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	// Revoked while the cache cannot hear it.
	rdb.HSet(ctx, c.Store().recordKey(k.ID), "revoked", time.Now().UnixMilli())
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.RLock()
		n := len(c.entries)
		c.mu.RUnlock()
		if n == 0 && c.Live() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the kill: %d entries, live %v", n, c.Live())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := c.Verify(ctx, plain); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after the subscription came back: %v, want ErrRevoked", err)
	}
}
