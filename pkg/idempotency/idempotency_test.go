package idempotency

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var redisAddr string

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { redisAddr = r.Addr }))
}

func newStore(t *testing.T, ttl time.Duration) (*Store, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	return New(rdb, testenv.KeyPrefix(t), ttl), rdb
}

func TestOneOfManyRacingRequestsWins(t *testing.T) {
	s, _ := newStore(t, time.Minute)
	ctx := context.Background()
	k, err := s.KeyFor("acme", "alice", "order-42", Fingerprint([]byte("/v1/chat"), []byte(`{"query":"hi"}`)))
	if err != nil {
		t.Fatal(err)
	}
	const racers = 16
	var mu sync.Mutex
	winners, holders := 0, map[string]bool{}
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			c, won, err := s.Claim(ctx, k, "chat-"+strings.Repeat("A", i+1))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if won {
				winners++
			}
			if !c.Same {
				t.Errorf("claim %+v not the same body", c)
			}
			holders[c.RequestID] = true
		})
	}
	wg.Wait()
	if winners != 1 || len(holders) != 1 {
		t.Fatalf("%d winners, holders %v; want one of each", winners, holders)
	}
	c, ok, err := s.Lookup(ctx, k)
	if err != nil || !ok || !holders[c.RequestID] {
		t.Fatalf("lookup %+v %v %v, want the winner", c, ok, err)
	}
}

func TestADifferentBodyIsNotTheSame(t *testing.T) {
	s, _ := newStore(t, time.Minute)
	ctx := context.Background()
	first, _ := s.KeyFor("acme", "alice", "k", Fingerprint([]byte(`{"query":"a"}`)))
	other, _ := s.KeyFor("acme", "alice", "k", Fingerprint([]byte(`{"query":"b"}`)))
	if _, won, err := s.Claim(ctx, first, "chat-1"); err != nil || !won {
		t.Fatal(won, err)
	}
	c, ok, err := s.Lookup(ctx, other)
	if err != nil || !ok || c.Same || c.RequestID != "chat-1" {
		t.Fatalf("lookup with another body %+v %v %v, want chat-1, not the same", c, ok, err)
	}
}

func TestKeysAreTheCallersOwn(t *testing.T) {
	s, _ := newStore(t, time.Minute)
	ctx := context.Background()
	a, _ := s.KeyFor("acme", "alice", "k", "f")
	b, _ := s.KeyFor("globex", "alice", "k", "f")
	bob, _ := s.KeyFor("acme", "bob", "k", "f")
	if _, won, err := s.Claim(ctx, a, "chat-a"); err != nil || !won {
		t.Fatal(won, err)
	}
	if _, ok, err := s.Lookup(ctx, b); err != nil || ok {
		t.Fatalf("another tenant's lookup found acme's claim (%v, %v)", ok, err)
	}
	if _, won, err := s.Claim(ctx, b, "chat-b"); err != nil || !won {
		t.Fatalf("another tenant could not claim the same key (%v, %v)", won, err)
	}
	if _, ok, err := s.Lookup(ctx, bob); err != nil || ok {
		t.Fatalf("another user of the tenant found alice's claim (%v, %v)", ok, err)
	}
}

func TestReleaseFreesOnlyItsOwnClaim(t *testing.T) {
	s, rdb := newStore(t, time.Minute)
	ctx := context.Background()
	k, _ := s.KeyFor("acme", "alice", "k", "f")
	if _, _, err := s.Claim(ctx, k, "chat-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, k, "chat-2"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Lookup(ctx, k); !ok {
		t.Fatal("a release by another request freed the claim")
	}
	if err := s.Release(ctx, k, "chat-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Lookup(ctx, k); ok {
		t.Fatal("the holder's release left the claim")
	}
	if _, won, err := s.Claim(ctx, k, "chat-3"); err != nil || !won {
		t.Fatalf("claim after release (%v, %v)", won, err)
	}
	if ttl := rdb.TTL(ctx, k.redisKey).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("claim ttl %v, want the retention window", ttl)
	}
}

func TestBadKeysAreRefused(t *testing.T) {
	s, _ := newStore(t, time.Minute)
	for _, bad := range []string{"", strings.Repeat("x", MaxKeyLength+1), "has space", "tab\t", "é"} {
		if _, err := s.KeyFor("acme", "alice", bad, "f"); !errors.Is(err, ErrBadKey) {
			t.Errorf("key %q: %v, want ErrBadKey", bad, err)
		}
	}
	if _, err := s.KeyFor("acme", "alice", strings.Repeat("x", MaxKeyLength), "f"); err != nil {
		t.Errorf("a key of the longest length was refused: %v", err)
	}
}
