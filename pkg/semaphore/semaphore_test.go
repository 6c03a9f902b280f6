package semaphore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

func TestLimitWaitAndRelease(t *testing.T) {
	rdb := srv.Client(t)
	s, err := New(rdb, Options{Key: testenv.KeyPrefix(t) + "sem", Limit: 2, Lease: time.Second, Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var held []*Permit
	for i := range 2 {
		p, err := s.Acquire(ctx, "", fmt.Sprint("h", i), 0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	if _, err := s.Acquire(ctx, "", "h2", 50*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("third acquire: %v", err)
	}
	// A waiter gets the permit released while it waits.
	go func() {
		time.Sleep(50 * time.Millisecond)
		held[0].Release(ctx)
	}()
	p, err := s.Acquire(ctx, "", "h3", 2*time.Second)
	if err != nil {
		t.Fatalf("acquire after a release: %v", err)
	}
	// Renewals keep a permit past its lease.
	time.Sleep(1500 * time.Millisecond)
	if _, err := s.Acquire(ctx, "", "h4", 0); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a permit held past its lease was given away: %v", err)
	}
	p.Release(ctx)
	held[1].Release(ctx)
	if n := holders(t, s); n != 0 {
		t.Fatalf("%d holders after every release", n)
	}
}

// A holder that stops renewing (a crashed process) loses its permit when
// its lease ends.
func TestCrashedHolderPermitComesBack(t *testing.T) {
	rdb := srv.Client(t)
	s, _ := New(rdb, Options{Key: testenv.KeyPrefix(t) + "sem", Limit: 1, Lease: 200 * time.Millisecond, Poll: 10 * time.Millisecond})
	ctx := context.Background()
	if ok, err := acquireScript.Run(ctx, rdb, []string{s.key}, "crashed", "", 1, 1, 200, 200).Int(); err != nil || ok != 1 {
		t.Fatal(ok, err)
	}
	start := time.Now()
	p, err := s.Acquire(ctx, "", "next", time.Second)
	if err != nil {
		t.Fatalf("acquire after the crashed holder's lease: %v", err)
	}
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Fatalf("got the permit after %v, before the crashed holder's lease ended", waited)
	}
	p.Release(ctx)
}

// holders counts the permits held (waiting marks aside).
func holders(t *testing.T, s *Semaphore) int {
	t.Helper()
	n := 0
	for _, m := range s.rdb.(*redis.Client).ZRange(context.Background(), s.key, 0, -1).Val() {
		if !strings.HasPrefix(m, "w\t") {
			n++
		}
	}
	return n
}

func acquireN(t *testing.T, s *Semaphore, group string, n int) []*Permit {
	t.Helper()
	var out []*Permit
	for i := range n {
		p, err := s.Acquire(context.Background(), group, fmt.Sprint(group, i), 0)
		if err != nil {
			t.Fatalf("%s's permit %d: %v", group, i+1, err)
		}
		out = append(out, p)
	}
	return out
}

// A group alone may take every permit up to its group limit; one that
// comes to wait shrinks the first's share to half, so the permits the
// first gives back go to the second, not back to the first.
func TestAGroupHoldsItsShare(t *testing.T) {
	s, err := New(srv.Client(t), Options{Key: testenv.KeyPrefix(t) + "sem", Limit: 4, Lease: time.Second, Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := acquireN(t, s, "acme", 4)
	got := make(chan error, 1)
	go func() {
		p, err := s.Acquire(ctx, "globex", "g", 2*time.Second)
		if err == nil {
			defer p.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond) // globex is waiting
	a[0].Release(ctx)
	if _, err := s.Acquire(ctx, "acme", "again", 0); !errors.Is(err, ErrTimeout) {
		t.Fatalf("acme, over its share of 2 while globex waits, took a permit back: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("globex waited in vain: %v", err)
	}
	for _, p := range a[1:] {
		p.Release(ctx)
	}
}

// A group limit caps a group however idle the rest are: one tenant
// saturating the semaphore leaves the other permits to the next.
func TestGroupLimitLeavesRoomForOthers(t *testing.T) {
	s, err := New(srv.Client(t), Options{Key: testenv.KeyPrefix(t) + "sem", Limit: 4, GroupLimit: 2, Lease: time.Second, Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := acquireN(t, s, "acme", 2)
	if _, err := s.Acquire(ctx, "acme", "third", 30*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("acme took a third permit: %v", err)
	}
	start := time.Now()
	g := acquireN(t, s, "globex", 2)
	if waited := time.Since(start); waited > 500*time.Millisecond {
		t.Fatalf("globex waited %v behind acme", waited)
	}
	if n := holders(t, s); n != 4 {
		t.Fatalf("%d held, want 4", n)
	}
	for _, p := range append(a, g...) {
		p.Release(ctx)
	}
	if _, err := New(srv.Client(t), Options{Key: "k", Limit: 2, GroupLimit: 3, Lease: time.Second}); err == nil {
		t.Fatal("a group limit over the limit was taken")
	}
	if _, err := s.Acquire(ctx, "a\tb", "h", 0); err == nil {
		t.Fatal("a group with a tab was taken")
	}
}

// A holder written without a group (by an older process, during an
// upgrade) counts as a permit held by group "".
func TestAHolderWithoutAGroupCounts(t *testing.T) {
	rdb := srv.Client(t)
	s, _ := New(rdb, Options{Key: testenv.KeyPrefix(t) + "sem", Limit: 2, Lease: time.Second, Poll: 10 * time.Millisecond})
	ctx := context.Background()
	rdb.ZAdd(ctx, s.key, redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "old-holder"})
	p := acquireN(t, s, "acme", 1)
	if _, err := s.Acquire(ctx, "globex", "g", 0); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a third permit of two: %v", err)
	}
	p[0].Release(ctx)
}
