package events

import (
	"context"
	"errors"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A reader that stops reading is cut off once its buffer is full, and
// nobody else waits for it: another reader of the same stream and a reader
// of another stream of the same group (read by the same XREAD) get every
// event meanwhile.
func TestHubCutsOffASlowReaderWithoutBlockingOthers(t *testing.T) {
	l, rdb := newLog(t)
	h := startHubWith(t, l, rdb, HubOptions{Block: 200 * time.Millisecond, MaxBuffered: 20})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	const neighbour = "other-4"
	if groupOf(neighbour) != groupOf("shared") {
		t.Fatalf("%q is not in the group of %q", neighbour, "shared")
	}
	slow, err := h.Subscribe(ctx, "shared", "")
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	peer, err := h.Subscribe(ctx, "shared", "")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	other, err := h.Subscribe(ctx, neighbour, "")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	// One event at a time, each read by the others before the next is
	// written: only the slow reader's buffer grows.
	const n = 100
	for i := 0; i < n; i++ {
		if _, err := l.Append(ctx, "shared", TypeToken, Token{Index: i}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(ctx, neighbour, TypeToken, Token{Index: i}); err != nil {
			t.Fatal(err)
		}
		for name, sub := range map[string]*Subscription{"peer": peer, "other": other} {
			evs, err := sub.Next(ctx)
			if err != nil || len(evs) != 1 {
				t.Fatalf("%s: event %d: %d events, %v (held up by the slow reader?)", name, i, len(evs), err)
			}
		}
	}
	// Only now does the slow reader look: its buffer was dropped, and it
	// is told to resume with Last-Event-ID.
	if evs, err := slow.Next(ctx); !errors.Is(err, ErrTooSlow) {
		t.Fatalf("slow reader got %d events, err %v; want ErrTooSlow", len(evs), err)
	}
}

// idPattern and maxUint64 restate what ValidID accepts, independently:
// two runs of decimal digits, each at most 2^64-1.
var (
	idPattern = regexp.MustCompile(`^([0-9]+)-([0-9]+)$`)
	maxUint64 = new(big.Int).SetUint64(^uint64(0))
)

func fitsUint64(digits string) bool {
	n, ok := new(big.Int).SetString(digits, 10)
	return ok && n.Cmp(maxUint64) <= 0
}

// FuzzValidID checks ValidID against its definition, and that an ID it
// accepts orders as the numbers it spells. Seeds: testdata/fuzz.
func FuzzValidID(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		m := idPattern.FindStringSubmatch(s)
		want := m != nil && fitsUint64(m[1]) && fitsUint64(m[2])
		if got := ValidID(s); got != want {
			t.Fatalf("ValidID(%q) = %v, want %v", s, got, want)
		}
		if !want {
			return
		}
		ms, _ := strconv.ParseUint(m[1], 10, 64)
		seq, _ := strconv.ParseUint(m[2], 10, 64)
		canon := strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(seq, 10)
		if !ValidID(canon) || CompareIDs(s, canon) != 0 || CompareIDs(s, s) != 0 {
			t.Fatalf("%q does not order as %s", s, canon)
		}
		if seq < ^uint64(0) {
			next := strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(seq+1, 10)
			if CompareIDs(s, next) != -1 || CompareIDs(next, s) != 1 {
				t.Fatalf("%q does not order before %s", s, next)
			}
		}
	})
}

// The keys of one request, and the wake stream of its group, carry the
// same hash tag, so Redis Cluster puts them in one slot; the stream key
// gives back its request.
func TestKeysOfARequestShareAHashTag(t *testing.T) {
	l := NewLog(nil, LogOptions{KeyPrefix: "sluice:"})
	tags := map[string]bool{}
	for i := range 200 {
		id := "chat-" + strconv.Itoa(i)
		key := l.Key(id)
		tag := hashTag(key)
		if tag == "" || hashTag(l.StopKey(id)) != tag || hashTag(l.wakeKey(groupOf(id), "x")) != tag {
			t.Fatalf("%s: stream %q, stop %q and wake %q do not share a hash tag",
				id, key, l.StopKey(id), l.wakeKey(groupOf(id), "x"))
		}
		tags[tag] = true
		if got, ok := l.RequestID(key); !ok || got != id {
			t.Fatalf("RequestID(%q) = %q, %v; want %q", key, got, ok, id)
		}
	}
	if len(tags) != streamGroups {
		t.Fatalf("200 requests in %d groups, want %d", len(tags), streamGroups)
	}
	for _, key := range []string{"sluice:ev:x", "sluice:ev:{ev:1}:chat-0", "other:ev:{ev:4}:chat-0", l.StopKey("chat-0")} {
		if id, ok := l.RequestID(key); ok {
			t.Errorf("RequestID(%q) = %q, want none", key, id)
		}
	}
}

// hashTag is the part of key Redis Cluster hashes when it has one: the
// text between its first "{" and the first "}" after it, if not empty.
func hashTag(key string) string {
	_, rest, ok := strings.Cut(key, "{")
	if !ok {
		return ""
	}
	tag, _, ok := strings.Cut(rest, "}")
	if !ok {
		return ""
	}
	return tag
}

// Readers of streams in every group are served, each group by its own
// read.
func TestHubServesEveryGroup(t *testing.T) {
	l, rdb := newLog(t)
	h := startHubWith(t, l, rdb, HubOptions{Block: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subs := map[string]*Subscription{}
	groups := map[int]bool{}
	for i := 0; len(groups) < streamGroups; i++ {
		id := "r" + strconv.Itoa(i)
		if groups[groupOf(id)] {
			continue
		}
		groups[groupOf(id)] = true
		sub, err := h.Subscribe(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		subs[id] = sub
	}
	for id := range subs {
		if _, err := l.Append(ctx, id, TypeToken, Token{Text: id}); err != nil {
			t.Fatal(err)
		}
	}
	for id, sub := range subs {
		evs, err := sub.Next(ctx)
		if err != nil || len(evs) != 1 || !strings.Contains(string(evs[0].Data), id) {
			t.Fatalf("%s (group %d): %+v, %v", id, groupOf(id), evs, err)
		}
	}
}
