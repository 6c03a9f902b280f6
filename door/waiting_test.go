package door_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/waitroom"
)

// waitAtDoor admits acme's req into the waiting room: the short pool's
// one permit is taken and acme's own request queues behind it, so the
// fair order puts req behind that and req waits at the door. It returns
// the admission and the queued entries' ids.
func (s *stack) waitAtDoor(ctx context.Context, req *door.Request) (door.Admission, []string) {
	s.t.Helper()
	held := s.fill(request.PoolShort, "acme", 2)
	adm, err := s.door.Admit(ctx, acme, req)
	if err != nil {
		s.t.Fatalf("admit into the waiting room: %v", err)
	}
	s.t.Cleanup(adm.Sub.Close)
	if adm.ID == "" || adm.Pool != request.PoolShort || len(s.temporal.inputs()) != 0 {
		s.t.Fatalf("admission %+v with %d starts: want one waiting for the short pool", adm, len(s.temporal.inputs()))
	}
	if st := s.door.Room(); st.Waiting != 1 {
		s.t.Fatalf("room %+v, want one waiting", st)
	}
	return adm, held
}

// release gives the pool's permit and queue places of ids back.
func (s *stack) release(ids ...string) {
	s.t.Helper()
	for _, id := range ids {
		if _, err := s.gate.Release(context.Background(), request.PoolShort, id); err != nil {
			s.t.Fatal(err)
		}
	}
}

// reserveOther holds a place of acme's in the short pool's fair order
// that is not the door's, so that a place given back twice shows.
func (s *stack) reserveOther() {
	s.t.Helper()
	if _, _, err := s.gate.Reserve(context.Background(), request.PoolShort, "acme", 1, 1, time.Minute); err != nil {
		s.t.Fatal(err)
	}
}

// queueEvents are the positions request id's queue events told, in order.
func (s *stack) queueEvents(id string) []events.Queue {
	var out []events.Queue
	for _, ev := range s.stream(id) {
		if ev.Type != events.TypeQueue {
			continue
		}
		var q events.Queue
		if err := json.Unmarshal(ev.Data, &q); err != nil {
			s.t.Fatal(err)
		}
		out = append(out, q)
	}
	return out
}

// A request waiting at the door is told its place behind the pool's
// queue as it changes, and starts when the pool can take it, with what
// is left of its max wait and the place the door reserved for it.
func TestWaiterStartsWhenThePoolCanTakeIt(t *testing.T) {
	s := newStack(t, onePermit)
	adm, held := s.waitAtDoor(context.Background(), s.request("hello", 100))
	if first := firstEvent(t, adm.Sub); first.Type != events.TypeAccepted {
		t.Fatalf("first event %s", first.Type)
	}
	eventually(t, "a queue event", func() bool { return len(s.queueEvents(adm.ID)) > 0 })
	// Behind acme's queued request, first at the door.
	if q := s.queueEvents(adm.ID)[0]; q.Position != 2 || q.Pool != request.PoolShort || q.EstimatedWaitMs < 0 {
		t.Fatalf("queue event %+v, want position 2 in short", q)
	}
	held = append(held, s.fill(request.PoolShort, "acme", 3)[2])
	eventually(t, "the position to move", func() bool {
		qs := s.queueEvents(adm.ID)
		return qs[len(qs)-1].Position == 3
	})
	if n := len(s.temporal.inputs()); n != 0 {
		t.Fatalf("%d started while the pool was full", n)
	}
	s.release(held...)
	eventually(t, "the start", func() bool { return len(s.temporal.inputs()) == 1 })
	in := s.temporal.only(t).in
	tier := meteredTier()
	if in.RequestID != adm.ID || in.Pool != request.PoolShort || in.AdmissionPlace.Tag == 0 || in.AdmissionPlace.Tenant != "acme" {
		t.Errorf("started %s in %s at place %+v", in.RequestID, in.Pool, in.AdmissionPlace)
	}
	if w := in.Settings.MaxWait; w >= tier.MaxWait || w < tier.MaxWait-5*time.Second || in.Settings.MaxWaitByPool != nil {
		t.Errorf("max wait %s (by pool %v), want what is left of %s", w, in.Settings.MaxWaitByPool, tier.MaxWait)
	}
	// What it holds goes on with its workflow: nothing is given back.
	near(t, "tokens charged", s.charged(), float64(s.bound("hello")+100))
	if n := s.placesReserved("acme"); n != 1 {
		t.Errorf("%d places reserved, want the one its workflow queues at", n)
	}
	if last, ok, _ := s.events.Last(context.Background(), adm.ID); !ok || events.Terminal(last.Type) {
		t.Errorf("the started request's stream ended: %s", last.Type)
	}
	if lines := s.finished(""); len(lines) != 0 {
		t.Errorf("a started request logged %v at the door", lines)
	}
	eventually(t, "the room to empty", func() bool { return s.door.Room() == (waitroom.Stats{}) })
}

// How a request that never leaves the waiting room ends: with its
// terminal event, its charge and its place given back once, its one
// "request finished" line, counted once, and, if it was refused, in its
// session; a refused request's Idempotency-Key is free again.
func TestWaiterEnds(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*config.Config)
		// end ends the waiting request; cancel ends its context.
		end                  func(s *stack, id string, cancel context.CancelFunc)
		typ, reason, message string
		outcome, counted     string
		retryAfter           int
		recorded             bool
		// lapses: the request ends by itself, perhaps before the test
		// looks at it waiting.
		lapses bool
		// key is what became of its Idempotency-Key: "freed" for the
		// client's retry, "kept" as the request's answer, "" unchecked.
		key string
	}{{
		name: "its max wait runs out",
		mod: func(c *config.Config) {
			onePermit(c)
			setTier(c, func(t *policy.Tier) { t.MaxWait = 500 * time.Millisecond })
		},
		end:    func(*stack, string, context.CancelFunc) {},
		lapses: true,
		typ:    events.TypeRejected, reason: request.ReasonQueueTimeout, message: "waited too long",
		outcome: request.OutcomeRejected, counted: "rejected_queue_timeout", retryAfter: 1, recorded: true, key: "freed",
	}, {
		name: "its class's deadline passes",
		mod: func(c *config.Config) {
			onePermit(c)
			setTier(c, func(t *policy.Tier) {
				t.Classes = map[string]policy.ClassLimits{request.ClassDefault: {Weight: 1, TTFTSLO: 500 * time.Millisecond, RefuseLate: true}}
			})
		},
		end:    func(*stack, string, context.CancelFunc) {},
		lapses: true,
		typ:    events.TypeRejected, reason: request.ReasonDeadlineUnreachable, message: "waited until its deadline",
		outcome: request.OutcomeRejected, counted: "rejected_deadline_unreachable", retryAfter: 1, recorded: true, key: "freed",
	}, {
		name: "its client goes away",
		mod:  onePermit,
		end:  func(_ *stack, _ string, cancel context.CancelFunc) { cancel() },
		typ:  events.TypeError, reason: request.ReasonCancelled, message: "client_disconnected",
		outcome: request.OutcomeCancelled, counted: "cancelled", key: "kept",
	}, {
		name: "its stop flag is raised",
		mod:  onePermit,
		end: func(s *stack, id string, _ context.CancelFunc) {
			if err := s.events.Stop(context.Background(), id, time.Minute); err != nil {
				s.t.Fatal(err)
			}
		},
		typ: events.TypeError, reason: request.ReasonCancelled, message: "client_request",
		outcome: request.OutcomeCancelled, counted: "cancelled", key: "kept",
	}, {
		name: "the process drains",
		mod:  onePermit,
		end: func(s *stack, _ string, cancel context.CancelFunc) {
			s.door.Drain()
			cancel()
		},
		typ: events.TypeRejected, reason: request.ReasonBusy, message: "restarting",
		outcome: request.OutcomeRejected, counted: "rejected_busy", retryAfter: 1, recorded: true, key: "freed",
	}, {
		name: "its start fails when its turn comes",
		mod:  onePermit,
		end: func(s *stack, _ string, _ context.CancelFunc) {
			s.temporal.failStarts(errors.New("frontend unavailable"))
			s.release("acme-a", "acme-b")
		},
		typ: events.TypeError, reason: request.ReasonUnavailable, message: "unavailable",
		outcome: request.OutcomeFailed, counted: "failed", retryAfter: 1,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, c.mod)
			s.reserveOther()
			before := s.holding()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := s.keyed("k1", "hello")
			req.SessionID = "s1"
			adm, _ := s.waitAtDoor(ctx, req)
			if n := s.placesReserved("acme"); n != 2 && !c.lapses {
				t.Fatalf("%d places reserved while waiting, want the door's and the test's", n)
			}
			c.end(s, adm.ID, cancel)
			last, f := s.terminal(adm.ID)
			if last.Type != c.typ || f.Reason != c.reason || !strings.Contains(f.Message, c.message) || f.RetryAfterS < c.retryAfter {
				t.Fatalf("ended %s %+v, want %s %s (%q), retry after >= %d", last.Type, f, c.typ, c.reason, c.message, c.retryAfter)
			}
			eventually(t, "the room to empty", func() bool { return s.door.Room().Waiting == 0 })
			// Exactly once: a place given back twice would take the
			// test's own place with it.
			settles(func() bool { return s.placesReserved("acme") == before.places && s.tenantTokens() > before.tokens-0.5 })
			after := s.holding()
			if after.places != before.places {
				t.Errorf("%d places reserved after the end, want the test's %d: the door's was given back %s",
					after.places, before.places, map[bool]string{true: "twice", false: "not at all"}[after.places < before.places])
			}
			near(t, "tokens bucket", after.tokens, before.tokens)
			near(t, "requests bucket", after.requests, before.requests)
			lines := s.finished("")
			if len(lines) != 1 || lines[0]["requestID"] != adm.ID || lines[0]["outcome"] != c.outcome || lines[0]["reason"] != c.reason ||
				lines[0]["route"] != request.PoolShort || lines[0]["queue_wait_ms"] == nil {
				t.Errorf("request finished lines %v, want one: %s %s with its admission time", lines, c.outcome, c.reason)
			}
			if n := s.counted(c.counted); n != 1 {
				t.Errorf("counted %v times as %s", n, c.counted)
			}
			turns, err := s.sessions.Turns(context.Background(), session.Owner{Tenant: "acme", User: "ann"}, "s1")
			if err != nil {
				t.Fatal(err)
			}
			if recorded := len(turns) == 1 && turns[0].RequestID == adm.ID && turns[0].Reason == c.reason; recorded != c.recorded || len(turns) > 1 {
				t.Errorf("session turns %+v, want recorded %v", turns, c.recorded)
			}
			if c.key == "" {
				return
			}
			// A rejected request frees its key for the client's retry;
			// any other end is the key's answer.
			s.release("acme-a", "acme-b")
			retry := s.admit(acme, s.keyed("k1", "hello"))
			if freed := retry.ID != adm.ID && !retry.Standing.Replayed; freed != (c.key == "freed") {
				t.Errorf("the retry was %s (replayed %v) after %s: key freed %v, want %s", retry.ID, retry.Standing.Replayed, adm.ID, freed, c.key)
			}
		})
	}
}

// A request whose workflow could not be started when its turn came at
// the door is told to retry in a second, as one whose start failed at
// once is; and like that one (TestStartFailureGivesEverythingBack) its
// Idempotency-Key must be free for that retry, not answer it with the
// failure for the key's retention.
func TestWaiterWhoseStartFailsFreesItsKey(t *testing.T) {
	s := newStack(t, onePermit)
	adm, held := s.waitAtDoor(context.Background(), s.keyed("k1", "hello"))
	s.temporal.failStarts(errors.New("frontend unavailable"))
	s.release(held...)
	if last, f := s.terminal(adm.ID); f.Reason != request.ReasonUnavailable || f.RetryAfterS != 1 {
		t.Fatalf("ended %s %+v, want unavailable, retry in 1 s", last.Type, f)
	}
	s.temporal.failStarts(nil)
	retry := s.admit(acme, s.keyed("k1", "hello"))
	if retry.ID == adm.ID || retry.Standing.Replayed {
		t.Fatalf("the retry replayed the failed request %s", adm.ID)
	}
	if n := len(s.temporal.inputs()); n != 2 {
		t.Fatalf("%d starts, want the failed one and the retry's", n)
	}
}

// A request whose turn comes with too little of its max wait left to get
// through the pool's queue ends at the door rather than start a workflow
// that would only time out in the queue.
func TestWaiterWithTooLittleWaitLeftEndsAtTheDoor(t *testing.T) {
	s := newStack(t, func(c *config.Config) {
		onePermit(c)
		c.API.QueuePerPermit = 3
		setTier(c, func(t *policy.Tier) { t.MaxWait = time.Second })
	})
	ctx := context.Background()
	// A permit held 400 ms: the pool's one permit turns over that often.
	s.fill(request.PoolShort, "other", 1)
	time.Sleep(400 * time.Millisecond)
	s.release("other-a")
	if st, err := s.gate.Stats(ctx, request.PoolShort); err != nil || st.MeanHold < 300*time.Millisecond {
		t.Fatalf("pool stats %+v (%v): the test needs a mean hold of 400 ms", st, err)
	}
	// One permit held and three queued: the queue is at its bound, and
	// acme's request waits at the door behind its own three.
	held := s.fill(request.PoolShort, "acme", 4)
	adm, err := s.door.Admit(ctx, acme, s.request("hello", 100))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Sub.Close()
	if st := s.door.Room(); st.Waiting != 1 {
		t.Fatalf("room %+v, want the request waiting", st)
	}
	// Room for one more in the queue, but two of acme's are ahead of it
	// there: three turnovers, 1.2 s, more than its whole max wait.
	s.release(held[3])
	eventually(t, "the request to end or start", func() bool {
		last, ok, _ := s.events.Last(ctx, adm.ID)
		return len(s.temporal.inputs()) > 0 || ok && events.Terminal(last.Type)
	})
	if n := len(s.temporal.inputs()); n != 0 {
		t.Fatalf("%d workflows started with no wait left", n)
	}
	last, f := s.terminal(adm.ID)
	if last.Type != events.TypeRejected || f.Reason != request.ReasonQueueTimeout {
		t.Fatalf("ended %s %+v, want rejected queue_timeout", last.Type, f)
	}
}

// A request that may have a stream paused for it (preemption on, its
// pool's backend continuing answers, a less urgent class below its own)
// is not refused at the door by the turnover estimate that refuses the
// same request without preemption: pausing, not turnover, gets it its
// permit.
func TestWaiterThatMayPauseAStreamIsNotRefusedByTheEstimate(t *testing.T) {
	s := newStack(t, func(c *config.Config) {
		onePermit(c)
		c.API.QueuePerPermit = 3
		c.Admission.Preemption.Enabled = true
		c.Pools.Short.Continuation = config.ContinuationVLLM
		setTier(c, func(t *policy.Tier) {
			t.MaxWait = time.Second
			t.DefaultClass = request.ClassPriority
			t.Classes = map[string]policy.ClassLimits{request.ClassPriority: {Weight: 1}}
		})
	})
	ctx := context.Background()
	s.fill(request.PoolShort, "other", 1)
	time.Sleep(400 * time.Millisecond)
	s.release("other-a")
	held := s.fill(request.PoolShort, "acme", 4)
	adm, err := s.door.Admit(ctx, acme, s.request("hello", 100))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Sub.Close()
	s.release(held[3])
	eventually(t, "the request to end or start", func() bool {
		last, ok, _ := s.events.Last(ctx, adm.ID)
		return len(s.temporal.inputs()) > 0 || ok && events.Terminal(last.Type)
	})
	if n := len(s.temporal.inputs()); n != 1 {
		last, _, _ := s.events.Last(ctx, adm.ID)
		t.Fatalf("%d workflows started (last event %+v), want the request started to pause a stream", n, last)
	}
}
