package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
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

func newLog(t *testing.T) (*Log, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	return NewLog(rdb, LogOptions{KeyPrefix: "t:" + t.Name() + ":", TTL: time.Minute}), rdb
}

func startHub(t *testing.T, l *Log, rdb *redis.Client) *Hub {
	t.Helper()
	return startHubWith(t, l, rdb, HubOptions{Block: 500 * time.Millisecond})
}

func startHubWith(t *testing.T, l *Log, rdb *redis.Client, opts HubOptions) *Hub {
	t.Helper()
	h := NewHub(rdb, l, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

func TestAppendAndAfter(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	id1, err := l.Append(ctx, "r1", TypeAccepted, Accepted{RequestID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AppendBatch(ctx, "r1", []Pending{{TypeToken, Token{Text: "a"}}, {TypeToken, Token{Text: "b", Index: 1}}}); err != nil {
		t.Fatal(err)
	}
	all, err := l.After(ctx, "r1", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].ID != id1 || all[0].Type != TypeAccepted || all[2].Type != TypeToken {
		t.Fatalf("unexpected events %+v", all)
	}
	var tok Token
	if err := json.Unmarshal(all[2].Data, &tok); err != nil || tok.Text != "b" {
		t.Fatalf("token data %s: %v", all[2].Data, err)
	}
	rest, _ := l.After(ctx, "r1", id1, 100)
	if len(rest) != 2 {
		t.Fatalf("after first: %d events", len(rest))
	}
	if ttl := rdb.PTTL(ctx, l.Key("r1")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("stream ttl %v", ttl)
	}
	last, ok, err := l.Last(ctx, "r1")
	if err != nil || !ok || last.ID != all[2].ID {
		t.Fatalf("last = %+v %v %v", last, ok, err)
	}
}

// Each reads a log longer than a page whole and in order, and stops at
// its callback's error.
func TestEachReadsEveryPage(t *testing.T) {
	l, _ := newLog(t)
	ctx := context.Background()
	n := eachPage + 5
	batch := make([]Pending, n)
	for i := range batch {
		batch[i] = Pending{TypeToken, Token{Index: i}}
	}
	if _, err := l.AppendBatch(ctx, "r1", batch); err != nil {
		t.Fatal(err)
	}
	next := 0
	err := l.Each(ctx, "r1", func(ev Event) error {
		var tok Token
		if err := json.Unmarshal(ev.Data, &tok); err != nil || tok.Index != next {
			t.Fatalf("event %d is token %d (%v)", next, tok.Index, err)
		}
		next++
		return nil
	})
	if err != nil || next != n {
		t.Fatalf("read %d of %d events: %v", next, n, err)
	}
	stop := errors.New("enough")
	seen := 0
	if err := l.Each(ctx, "r1", func(Event) error { seen++; return stop }); !errors.Is(err, stop) || seen != 1 {
		t.Fatalf("after its callback's error: %v, %d events", err, seen)
	}
}

func TestHubDeliversInOrderAndResumes(t *testing.T) {
	l, rdb := newLog(t)
	h := startHub(t, l, rdb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	sub, err := h.Subscribe(ctx, "r", "")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	const n = 200
	go func() {
		for i := 0; i < n; i++ {
			if _, err := l.Append(ctx, "r", TypeToken, Token{Index: i}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var got []Event
	for len(got) < n {
		evs, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %d events: %v", len(got), err)
		}
		got = append(got, evs...)
	}
	for i, ev := range got {
		var tok Token
		_ = json.Unmarshal(ev.Data, &tok)
		if tok.Index != i {
			t.Fatalf("event %d has index %d", i, tok.Index)
		}
	}

	// A second reader resuming from the middle sees exactly the rest.
	resume, err := h.Subscribe(ctx, "r", got[149].ID)
	if err != nil {
		t.Fatal(err)
	}
	defer resume.Close()
	var rest []Event
	for len(rest) < 50 {
		evs, err := resume.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, evs...)
	}
	if len(rest) != 50 || rest[0].ID != got[150].ID {
		t.Fatalf("resume got %d events starting %s, want 50 from %s", len(rest), rest[0].ID, got[150].ID)
	}
}

func TestHubManyStreams(t *testing.T) {
	l, rdb := newLog(t)
	h := startHub(t, l, rdb)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const streams, per = 50, 20
	var wg sync.WaitGroup
	for s := 0; s < streams; s++ {
		id := fmt.Sprintf("s%d", s)
		sub, err := h.Subscribe(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer sub.Close()
			seen := 0
			for seen < per {
				evs, err := sub.Next(ctx)
				if err != nil {
					t.Errorf("%s: %v after %d", id, err, seen)
					return
				}
				seen += len(evs)
			}
			if seen != per {
				t.Errorf("%s: %d events, want %d", id, seen, per)
			}
		}()
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				_, _ = l.Append(ctx, id, TypeToken, Token{Index: i})
			}
		}()
	}
	wg.Wait()
}

// A reader that joins while another reader of the same stream is mid-read
// must still get every event after its own cursor.
func TestHubLateSubscriberGetsEverything(t *testing.T) {
	l, rdb := newLog(t)
	h := startHub(t, l, rdb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for trial := 0; trial < 30; trial++ {
		id := fmt.Sprintf("late%d", trial)
		first, err := h.Subscribe(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		const n = 40
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; i < n; i++ {
				_, _ = l.Append(ctx, id, TypeToken, Token{Index: i})
			}
		}()
		// Join while tokens flow, from the very start.
		time.Sleep(time.Duration(trial%5) * time.Millisecond)
		late, err := h.Subscribe(ctx, id, "0")
		if err != nil {
			t.Fatal(err)
		}
		var got []Event
		for len(got) < n {
			evs, err := late.Next(ctx)
			if err != nil {
				t.Fatalf("trial %d: %v after %d", trial, err, len(got))
			}
			got = append(got, evs...)
		}
		for i, ev := range got {
			var tok Token
			_ = json.Unmarshal(ev.Data, &tok)
			if tok.Index != i {
				t.Fatalf("trial %d: event %d has index %d (lost or repeated)", trial, i, tok.Index)
			}
		}
		<-done
		first.Close()
		late.Close()
	}
}

func TestHubCloseEndsNext(t *testing.T) {
	l, rdb := newLog(t)
	h := startHub(t, l, rdb)
	ctx := context.Background()
	sub, err := h.Subscribe(ctx, "x", "")
	if err != nil {
		t.Fatal(err)
	}
	sub.Close()
	if _, err := sub.Next(ctx); err != ErrClosed {
		t.Fatalf("Next after Close = %v, want ErrClosed", err)
	}
}

func TestValidIDAndCompare(t *testing.T) {
	for _, s := range []string{"1-0", "1700000000000-12"} {
		if !ValidID(s) {
			t.Errorf("ValidID(%q) = false", s)
		}
	}
	for _, s := range []string{"", "1", "a-1", "1-", "-1", "1-2-3", "1-2 ", "99999999999999999999-0", "1-+2", "+1-2"} {
		if ValidID(s) {
			t.Errorf("ValidID(%q) = true", s)
		}
	}
	if compareIDs("9-1", "10-0") >= 0 || compareIDs("10-2", "10-10") >= 0 || compareIDs("5-5", "5-5") != 0 {
		t.Fatal("compareIDs is not numeric")
	}
}

// Writers that race to end a request leave exactly one end, and the ones
// that lost are told which end is there.
func TestAppendFinalWritesOneEnd(t *testing.T) {
	l, rdb := newLog(t)
	ctx := context.Background()
	if _, err := l.Append(ctx, "r1", TypeToken, Token{Text: "a", Index: 0}); err != nil {
		t.Fatal(err)
	}
	const writers = 8
	type result struct {
		id      string
		written bool
		err     error
	}
	results := make(chan result, writers)
	for i := range writers {
		go func() {
			typ := TypeError
			if i%2 == 0 {
				typ = TypeDone
			}
			id, written, err := l.AppendFinal(ctx, "r1", typ, Failure{Reason: "x"})
			results <- result{id, written, err}
		}()
	}
	var ids []string
	wrote := 0
	for range writers {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.written {
			wrote++
		}
		ids = append(ids, r.id)
	}
	if wrote != 1 {
		t.Fatalf("%d writers wrote an end, want 1", wrote)
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("writers were told of different ends: %v", ids)
		}
	}
	evs, err := l.After(ctx, "r1", "0", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || !Terminal(evs[1].Type) || evs[1].ID != ids[0] {
		t.Fatalf("events %+v, want the token and one end with id %s", evs, ids[0])
	}
	if ttl := rdb.PTTL(ctx, l.Key("r1")).Val(); ttl <= 0 {
		t.Fatalf("stream ttl %v after the end, want it refreshed", ttl)
	}
	// A stray event after the end does not let a second end in.
	if _, err := l.Append(ctx, "r1", TypeQueue, Queue{Position: 1}); err != nil {
		t.Fatal(err)
	}
	if _, written, err := l.AppendFinal(ctx, "r1", TypeError, Failure{Reason: "late"}); err != nil || written {
		t.Fatalf("a late end was written (%v, %v)", written, err)
	}
	if _, _, err := l.AppendFinal(ctx, "r1", TypeToken, Token{}); err == nil {
		t.Fatal("AppendFinal took a token")
	}
}

// AppendFinalAfter writes the events before the end with it, in order,
// once: a second call finds the end and writes none of them.
func TestAppendFinalAfterWritesItsEventsOnce(t *testing.T) {
	l, _ := newLog(t)
	ctx := context.Background()
	toks := []Pending{{TypeToken, Token{Text: "a", Index: 0}}, {TypeToken, Token{Text: "b", Index: 1}}}
	for range 2 {
		if _, _, err := l.AppendFinalAfter(ctx, "r1", toks, TypeDone, Done{RequestID: "r1", Cached: true}); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := l.After(ctx, "r1", "0", 100)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	if want := []string{TypeToken, TypeToken, TypeDone}; !slices.Equal(types, want) {
		t.Fatalf("events %v, want %v", types, want)
	}
	if _, _, err := l.AppendFinalAfter(ctx, "r2", []Pending{{TypeError, Failure{}}}, TypeDone, Done{}); err == nil {
		t.Fatal("AppendFinalAfter took a terminal event before the end")
	}
}

// End finds a request's end past a stray event written after it (as
// AppendFinal looks past it), and finds none in a stream without one.
func TestEndLooksPastStrays(t *testing.T) {
	l, _ := newLog(t)
	ctx := context.Background()
	if _, ok, err := l.End(ctx, "r"); ok || err != nil {
		t.Fatalf("end of an empty stream: %v %v", ok, err)
	}
	if _, err := l.Append(ctx, "r", TypeAccepted, Accepted{RequestID: "r"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.End(ctx, "r"); ok || err != nil {
		t.Fatalf("end of a running request: %v %v", ok, err)
	}
	done, _, err := l.AppendFinal(ctx, "r", TypeDone, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, "r", TypeQueue, Queue{Position: 1}); err != nil {
		t.Fatal(err)
	}
	end, ok, err := l.End(ctx, "r")
	if err != nil || !ok || end.ID != done || end.Type != TypeDone {
		t.Fatalf("end %+v %v %v, want the done event %s behind the stray queue event", end, ok, err, done)
	}
}

// A subscription that ends just after it was handed events (one signal
// for both) signals again once they are drained, so a reader selecting on
// Notify comes back for the end.
func TestDrainSignalsAnEndThatFollowedEvents(t *testing.T) {
	l, rdb := newLog(t)
	h := startHub(t, l, rdb)
	ctx := context.Background()
	sub, err := h.Subscribe(ctx, "r", "0")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sub.push([]Event{{ID: "1-1", Type: TypeToken}}, 100)
	sub.fail(ErrClosed)
	<-sub.Notify()
	if evs, err := sub.Drain(); len(evs) != 1 || err != nil {
		t.Fatalf("drain: %v %v, want the event", evs, err)
	}
	select {
	case <-sub.Notify():
	case <-time.After(time.Second):
		t.Fatal("no signal for the end after the events were drained")
	}
	if _, err := sub.Drain(); err != ErrClosed {
		t.Fatalf("drain after the events: %v, want ErrClosed", err)
	}
}
