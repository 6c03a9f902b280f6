package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/semaphore"
	"github.com/sluice-dev/sluice/pkg/session"
)

// A request's event stream: the batch's transaction, the final event's
// script, the stop flag and the reads.
func TestEvents(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	log := events.NewLog(rdb, events.LogOptions{KeyPrefix: prefix, TTL: time.Minute})
	_, err := log.AppendBatch(ctx, "req-1", []events.Pending{
		{Type: events.TypeAccepted, Data: events.Accepted{RequestID: "req-1", Tenant: "acme"}},
		{Type: events.TypeStage, Data: events.Stage{Stage: "retrieval"}},
	})
	ok(t, "append batch", err)
	_, err = log.Append(ctx, "req-1", events.TypeToken, events.Token{Text: "hi"})
	ok(t, "append", err)
	ok(t, "stop", log.Stop(ctx, "req-1", time.Minute))
	stopped, err := log.Stopped(ctx, "req-1")
	ok(t, "stopped", err)
	_, written, err := log.AppendFinal(ctx, "req-1", events.TypeDone, events.Done{RequestID: "req-1"})
	ok(t, "append final", err)
	_, again, err := log.AppendFinal(ctx, "req-1", events.TypeError, events.Failure{Reason: "late"})
	ok(t, "append final again", err)
	if !stopped || !written || again {
		t.Fatalf("stopped %v, final written %v then %v; want true, true, false", stopped, written, again)
	}
	evs, err := log.After(ctx, "req-1", "", 10)
	ok(t, "read", err)
	if len(evs) != 4 || evs[3].Type != events.TypeDone {
		t.Fatalf("events %+v", evs)
	}
}

// The event hub reads the streams of each group, and the group's wake
// stream, in one XREAD: they share the group's slot. Readers of requests
// in different groups (slots) are each served. A token's write and its
// stop flag's read, which the LLM activity pipelines, are sent here in
// one MULTI: a plain pipeline would be split per slot without complaint,
// a MULTI fails unless the two keys share a slot.
func TestEventHub(t *testing.T) {
	rdb, prefix := client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := events.NewLog(rdb, events.LogOptions{KeyPrefix: prefix, TTL: time.Minute})
	hub := events.NewHub(rdb, log, events.HubOptions{Block: 100 * time.Millisecond, Logger: logger(t)})
	go func() { _ = hub.Run(ctx) }()
	ids := []string{"req-1", "req-2", "req-3", "req-4", "req-5", "req-6"}
	subs := make([]*events.Subscription, len(ids))
	for i, id := range ids {
		sub, err := hub.Subscribe(ctx, id, "")
		ok(t, "subscribe", err)
		defer sub.Close()
		subs[i] = sub
	}
	slots := map[int64]bool{}
	for _, id := range ids {
		args, err := log.XAddArgs(id, events.TypeToken, events.Token{Text: id})
		ok(t, "encode", err)
		pipe := rdb.TxPipeline()
		pipe.XAdd(ctx, args)
		pipe.Exists(ctx, log.StopKey(id))
		_, err = pipe.Exec(ctx)
		ok(t, "append a token and read the stop flag of "+id, err)
		slot, err := rdb.ClusterKeySlot(ctx, log.Key(id)).Result()
		ok(t, "slot", err)
		slots[slot] = true
	}
	if len(slots) < 2 {
		t.Fatalf("the requests' streams are all in one slot: the test reads no second slot")
	}
	wctx, stop := context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	for i, sub := range subs {
		if evs, err := sub.Next(wctx); err != nil || len(evs) != 1 {
			t.Fatalf("hub delivered %+v, %v to the reader of %s", evs, err, ids[i])
		}
	}
}

// The latency window's flush and read scripts over several series.
func TestLatency(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	w, err := latency.New(rdb, latency.Options{KeyPrefix: prefix, Slot: time.Second, Retention: 10 * time.Second})
	ok(t, "new window", err)
	series := []string{"llm/short", "llm/long", "retrieval/short", "llm_timeout/short"}
	for i, s := range series {
		w.Record(s, time.Duration(i+1)*time.Millisecond)
		w.Add(s, 1)
	}
	ok(t, "flush", w.Flush(ctx))
	stats, err := w.Snapshots(ctx, 5*time.Second, series...)
	ok(t, "read", err)
	for i, s := range stats {
		if s.Count != 1 || s.Added != 1 {
			t.Errorf("series %s: %+v, want one latency and one added", series[i], s)
		}
	}
}

// The semaphore's acquire and renew scripts.
func TestSemaphore(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	s, err := semaphore.New(rdb, semaphore.Options{Key: prefix + "ingest:permits", Limit: 1, Lease: 150 * time.Millisecond, Poll: 10 * time.Millisecond})
	ok(t, "new semaphore", err)
	p, err := s.Acquire(ctx, "", "one", time.Second)
	ok(t, "acquire", err)
	time.Sleep(200 * time.Millisecond) // renewed meanwhile
	select {
	case <-p.Lost():
		t.Fatal("the permit was lost: renew failed")
	default:
	}
	if _, err := s.Acquire(ctx, "", "two", 20*time.Millisecond); err == nil {
		t.Fatal("a second holder got the only permit")
	}
	ok(t, "release", p.Release(ctx))
}

// A session's append script.
func TestSessions(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	s, err := session.New(rdb, session.Options{KeyPrefix: prefix, TTL: time.Minute, MaxTurns: 3})
	ok(t, "new store", err)
	o := session.Owner{Tenant: "acme", User: "alice"}
	for i := range 2 {
		ok(t, "append", s.Append(ctx, o, "s1", session.Turn{RequestID: fmt.Sprint("r", i), Query: "q"}))
	}
	ok(t, "append again", s.Append(ctx, o, "s1", session.Turn{RequestID: "r1", Query: "q"}))
	turns, err := s.Turns(ctx, o, "s1")
	ok(t, "turns", err)
	if len(turns) != 2 {
		t.Fatalf("turns %+v, want 2", turns)
	}
}
