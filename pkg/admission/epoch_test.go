package admission

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// The gate tells apart the Redis process it noted, another one (a
// failover or a restart with data) and keys that vanished (an empty
// restart), and tells each change to one caller only.
func TestCheckServer(t *testing.T) {
	g, rdb := newGate(t, 1, nil)
	ctx := context.Background()
	id, err := g.ServerOf(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := rdb.Info(ctx, "server").Result(); len(id) != 40 || !strings.Contains(want, "run_id:"+id+"\r\n") {
		t.Fatalf("ServerOf = %q, not the server's run_id", id)
	}
	check := func(runID string, want Served) {
		t.Helper()
		got, err := g.CheckServer(ctx, "p", runID)
		if err != nil || got != want {
			t.Fatalf("CheckServer(%s) = %v, %v; want %v", runID, got, err, want)
		}
	}
	check(id, ServedLost) // nothing noted yet: the first run
	check(id, ServedSame)
	check(id, ServedSame)
	check("replica-promoted", ServedMoved) // a failover: told once
	check("replica-promoted", ServedSame)
	// Redis restarted empty: the pool's keys and its epoch are gone.
	keys, _ := rdb.Keys(ctx, g.prefix+"*").Result()
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	check("replica-promoted", ServedLost)
}

// A real restart gives the server a new run id: the change a janitor
// notices after a Redis without a replica comes back.
func TestServerOfChangesOnRestart(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client(t)
	g, err := New(rdb, Options{Lease: 1e9, WaiterTTL: 1e9, MaxQueueDepth: 1, Limits: map[string]int{"p": 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before, err := g.ServerOf(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.CheckServer(ctx, "p", before); err != nil {
		t.Fatal(err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	after, err := g.ServerOf(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if after == before {
		t.Fatalf("run id %s unchanged across a restart", after)
	}
	if got, err := g.CheckServer(ctx, "p", after); err != nil || got != ServedLost {
		t.Fatalf("after an empty restart CheckServer = %v, %v; want lost", got, err)
	}
}

// Reached: queued, holding a permit, or released count as in the pool;
// a request never enqueued does not.
func TestReached(t *testing.T) {
	g, _ := newGate(t, 1, nil)
	ctx := context.Background()
	reached := func(id string) bool {
		t.Helper()
		ok, err := g.Reached(ctx, "p", id)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if reached("holder") {
		t.Fatal("a request never enqueued reached the pool")
	}
	mustEnqueue(t, g, "holder") // granted
	if r := mustEnqueue(t, g, "waiter"); r.Status != Queued {
		t.Fatalf("waiter: %+v", r)
	}
	if !reached("holder") || !reached("waiter") {
		t.Fatal("a holder or a waiter did not count as reached")
	}
	if _, err := g.Release(ctx, "p", "holder"); err != nil {
		t.Fatal(err)
	}
	if !reached("holder") {
		t.Fatal("a released request did not count as reached")
	}
}
