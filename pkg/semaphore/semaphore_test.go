package semaphore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

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
		p, err := s.Acquire(ctx, fmt.Sprint("h", i), 0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	if _, err := s.Acquire(ctx, "h2", 50*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("third acquire: %v", err)
	}
	// A waiter gets the permit released while it waits.
	go func() {
		time.Sleep(50 * time.Millisecond)
		held[0].Release(ctx)
	}()
	p, err := s.Acquire(ctx, "h3", 2*time.Second)
	if err != nil {
		t.Fatalf("acquire after a release: %v", err)
	}
	// Renewals keep a permit past its lease.
	time.Sleep(1500 * time.Millisecond)
	if _, err := s.Acquire(ctx, "h4", 0); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a permit held past its lease was given away: %v", err)
	}
	p.Release(ctx)
	held[1].Release(ctx)
	if n := rdb.ZCard(ctx, s.key).Val(); n != 0 {
		t.Fatalf("%d holders after every release", n)
	}
}

// A holder that stops renewing (a crashed process) loses its permit when
// its lease ends.
func TestCrashedHolderPermitComesBack(t *testing.T) {
	rdb := srv.Client(t)
	s, _ := New(rdb, Options{Key: testenv.KeyPrefix(t) + "sem", Limit: 1, Lease: 200 * time.Millisecond, Poll: 10 * time.Millisecond})
	ctx := context.Background()
	if ok, err := acquireScript.Run(ctx, rdb, []string{s.key}, "crashed", 1, 200).Int(); err != nil || ok != 1 {
		t.Fatal(ok, err)
	}
	start := time.Now()
	p, err := s.Acquire(ctx, "next", time.Second)
	if err != nil {
		t.Fatalf("acquire after the crashed holder's lease: %v", err)
	}
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Fatalf("got the permit after %v, before the crashed holder's lease ended", waited)
	}
	p.Release(ctx)
}
