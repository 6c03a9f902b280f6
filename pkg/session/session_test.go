package session

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

var acme = Owner{Tenant: "acme", User: "alice"}

func newStore(t *testing.T, maxTurns int) *Store {
	t.Helper()
	s, err := New(srv.Client(t), Options{KeyPrefix: testenv.KeyPrefix(t), TTL: time.Hour, MaxTurns: maxTurns})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAppendKeepsNewestTurnsOnce(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 3)
	for i := range 5 {
		turn := Turn{RequestID: fmt.Sprint("chat-", i), Query: fmt.Sprint("q", i), Answer: "a", Outcome: request.OutcomeDone}
		if err := s.Append(ctx, acme, "s1", turn); err != nil {
			t.Fatal(err)
		}
		// A retried append (first answer lost) adds nothing.
		if err := s.Append(ctx, acme, "s1", turn); err != nil {
			t.Fatal(err)
		}
	}
	turns, err := s.Turns(ctx, acme, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(turns) != 3 || turns[0].Query != "q2" || turns[2].Query != "q4" {
		t.Fatalf("turns = %+v, want q2..q4", turns)
	}
	ttl := srv.Client(t).PTTL(ctx, s.Key(acme, "s1")).Val()
	if ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("ttl = %v, want about an hour", ttl)
	}
}

func TestSessionsBelongToTheirUser(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 10)
	alice := Owner{Tenant: "acme", User: "alice"}
	if err := s.Append(ctx, alice, "s1", Turn{RequestID: "chat-1", Query: "mine", Outcome: request.OutcomeDone}); err != nil {
		t.Fatal(err)
	}
	// No owner and id may spell another's key.
	for _, o := range []struct {
		owner Owner
		id    string
	}{{Owner{"a", "cme:5:alice"}, "s1"}, {Owner{"acme", "a"}, "lice:s1"}, {Owner{"acme", "alice:s1"}, ""}} {
		if s.Key(o.owner, o.id) == s.Key(alice, "s1") {
			t.Fatalf("%+v %q spells alice's key", o.owner, o.id)
		}
	}
	for _, other := range []Owner{{"acme", "bob"}, {"globex", "alice"}, {"acme", ""}} {
		turns, err := s.Turns(ctx, other, "s1")
		if err != nil || len(turns) != 0 {
			t.Fatalf("%+v sees %v (%v)", other, turns, err)
		}
		if gone, err := s.Forget(ctx, other, "s1"); err != nil || gone {
			t.Fatalf("%+v forgot alice's session: %v %v", other, gone, err)
		}
	}
	if gone, err := s.Forget(ctx, alice, "s1"); err != nil || !gone {
		t.Fatalf("forget = %v %v", gone, err)
	}
	if turns, _ := s.Turns(ctx, alice, "s1"); len(turns) != 0 {
		t.Fatalf("forgotten session still has %v", turns)
	}
}

func TestRequestIDsThatShareAPrefixAreDifferentTurns(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 10)
	for _, id := range []string{"chat-1", "chat-10", `chat-"1"`} {
		if err := s.Append(ctx, acme, "s", Turn{RequestID: id, Query: id, Outcome: request.OutcomeDone}); err != nil {
			t.Fatal(err)
		}
	}
	if turns, _ := s.Turns(ctx, acme, "s"); len(turns) != 3 {
		t.Fatalf("turns = %+v", turns)
	}
}

func TestUnansweredTurnsSaySo(t *testing.T) {
	e := Turn{Query: "q", Outcome: request.OutcomeRejected}.Exchange()
	if e.User != "q" || e.Assistant == "" {
		t.Fatalf("rejected turn as %+v", e)
	}
	if e := (Turn{Query: "q", Answer: "a", Outcome: request.OutcomeDone}).Exchange(); e.Assistant != "a" {
		t.Fatalf("answered turn as %+v", e)
	}
}
