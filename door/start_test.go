package door_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// keyed is a validated request of acme's with an Idempotency-Key, its
// fingerprint that of its query.
func (s *stack) keyed(key, query string) *door.Request {
	req := s.request(query, 100)
	req.IdempotencyKey, req.Fingerprint = key, door.Fingerprint("/v1/chat", req.Query, req.KB, req.SessionID, *req.MaxTokens)
	return req
}

// A workflow that cannot be started leaves nothing behind: its charge
// and month are given back, and its stream is deleted, or, when an
// Idempotency-Key named it (someone may have attached by the key), ended
// with an error event and the key freed for the client's retry.
func TestStartFailureGivesEverythingBack(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		name := map[bool]string{false: "without a key", true: "with an idempotency key"}[keyed]
		t.Run(name, func(t *testing.T) {
			s := newStack(t, withBudget(policy.Budget{TokensPerMonth: 100000}))
			s.temporal.failStarts(errors.New("frontend unavailable"))
			before := s.holding()
			req := s.request("hello", 100)
			if keyed {
				req = s.keyed("k1", "hello")
			}
			adm, err := s.door.Admit(context.Background(), acme, req)
			e := refusalOf(t, err)
			if e.Class != refusal.Unavailable || e.Code != request.ReasonUnavailable || e.RetryAfter != 1 || adm.ID != "" || adm.Sub != nil {
				t.Fatalf("refused %+v, admission %+v; want unavailable, retry in 1 s, no id", e, adm)
			}
			ins := s.temporal.inputs()
			if len(ins) != 1 || ins[0].RateReservation == "" || ins[0].BudgetReservation == "" {
				t.Fatalf("start attempts %+v, want one with its reservations", ins)
			}
			id := ins[0].RequestID
			after := s.holding()
			near(t, "tokens bucket", after.tokens, before.tokens)
			near(t, "requests bucket", after.requests, before.requests)
			if after.month != before.month || after.places != before.places {
				t.Errorf("held %+v after the failed start, %+v before", after, before)
			}
			if !strings.Contains(s.logs.String(), `"msg":"start chat workflow"`) {
				t.Error("the failed start is not logged")
			}
			if !keyed {
				if after.streams != 0 {
					t.Errorf("%d streams left behind", after.streams)
				}
				return
			}
			last, f := s.terminal(id)
			if last.Type != events.TypeError || f.Reason != request.ReasonUnavailable {
				t.Errorf("the keyed stream ended %s %+v, want error unavailable", last.Type, f)
			}
			// The key is free: the client's retry starts a request.
			s.temporal.failStarts(nil)
			retry := s.admit(acme, s.keyed("k1", "hello"))
			if retry.ID == id || retry.Standing.Replayed || len(s.temporal.inputs()) != 2 {
				t.Errorf("the retry was %q (replayed %v), the failed one %q", retry.ID, retry.Standing.Replayed, id)
			}
		})
	}
}

// A start that reports an error, for a workflow the server did start
// (its reply was lost), is followed: the client is admitted and the
// request keeps what it holds, which its workflow gives back.
func TestStartThatErredButRanIsFollowed(t *testing.T) {
	s := newStack(t, nil)
	s.temporal.failStarts(errors.New("context deadline exceeded"))
	s.temporal.exists.Store(true)
	adm := s.admit(acme, s.request("hello", 100))
	in := s.temporal.only(t).in
	if adm.ID != in.RequestID || adm.Pool != request.PoolShort {
		t.Fatalf("admission %+v for start %s", adm, in.RequestID)
	}
	near(t, "tokens still charged", s.charged(), float64(s.bound("hello")+100))
	if ok, err := s.events.Exists(context.Background(), adm.ID); err != nil || !ok {
		t.Fatalf("the stream of a running request is gone: %v", err)
	}
	if first := firstEvent(t, adm.Sub); first.Type != events.TypeAccepted {
		t.Errorf("first event %s", first.Type)
	}
	if !strings.Contains(s.logs.String(), "the workflow exists; following it") {
		t.Error("the start that went through is not logged")
	}
}

// An Idempotency-Key names one request for its caller: the same body
// again attaches to it, charged nothing of the chat's limits; another
// body is refused; a key that is not one is refused before anything is
// done.
func TestIdempotencyKeys(t *testing.T) {
	s := newStack(t, nil)
	first := s.admit(acme, s.keyed("k1", "hello"))
	charged := s.charged()
	cases := []struct {
		name   string
		who    door.Caller
		req    *door.Request
		class  refusal.Class
		code   string
		replay bool
	}{
		{name: "the same body replays the request", who: acme, req: s.keyed("k1", "hello"), replay: true},
		{name: "another body is refused", who: acme, req: s.keyed("k1", "goodbye"), class: refusal.Unprocessable, code: "idempotency_key_reused"},
		{name: "a key with a space is refused", who: acme, req: s.keyed("k 1", "hello"), class: refusal.Invalid, code: "bad_idempotency_key"},
		{name: "a key too long is refused", who: acme, req: s.keyed(strings.Repeat("k", 300), "hello"), class: refusal.Invalid, code: "bad_idempotency_key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			adm, err := s.door.Admit(context.Background(), c.who, c.req)
			if !c.replay {
				e := refusalOf(t, err)
				if e.Class != c.class || e.Code != c.code {
					t.Fatalf("refused %v %s, want %v %s", e.Class, e.Code, c.class, c.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer adm.Sub.Close()
			if adm.ID != first.ID || !adm.Standing.Replayed || adm.Pool != "" || adm.Standing.Tokens != nil {
				t.Fatalf("replay %+v, want %s replayed, charged nothing", adm, first.ID)
			}
			if ev := firstEvent(t, adm.Sub); ev.Type != events.TypeAccepted || !strings.Contains(string(ev.Data), first.ID) {
				t.Errorf("the replay follows %s %s", ev.Type, ev.Data)
			}
		})
	}
	near(t, "tokens charged", s.charged(), charged)
	if n := len(s.temporal.inputs()); n != 1 {
		t.Errorf("%d workflows started, want 1", n)
	}
	// Keys are the caller's: another user's k1 is a request of its own.
	other := acme
	other.User = "bob"
	if adm := s.admit(other, s.keyed("k1", "hello")); adm.ID == first.ID || adm.Standing.Replayed {
		t.Errorf("bob's k1 replayed ann's request")
	}
}

// A key whose request's events are gone names nothing: the POST starts a
// request anew.
func TestIdempotencyKeyOfAGoneRequestStartsAnew(t *testing.T) {
	s := newStack(t, nil)
	first := s.admit(acme, s.keyed("k1", "hello"))
	if err := s.events.Delete(context.Background(), first.ID); err != nil {
		t.Fatal(err)
	}
	again := s.admit(acme, s.keyed("k1", "hello"))
	if again.ID == first.ID || again.Standing.Replayed || len(s.temporal.inputs()) != 2 {
		t.Fatalf("again %+v after %s's events expired", again, first.ID)
	}
	// And the key now names the new request.
	third := s.admit(acme, s.keyed("k1", "hello"))
	if third.ID != again.ID || !third.Standing.Replayed {
		t.Fatalf("third %+v, want a replay of %s", third, again.ID)
	}
}

// POSTs racing with one key start one workflow; every one of them follows
// it, and those that lost the race gave back what they were charged.
func TestRacingPostsWithOneKeyStartOneWorkflow(t *testing.T) {
	s := newStack(t, nil)
	const n = 8
	reqs := make([]*door.Request, n)
	for i := range reqs {
		reqs[i] = s.keyed("race", "hello")
	}
	adms := make([]door.Admission, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			adms[i], errs[i] = s.door.Admit(context.Background(), acme, reqs[i])
		}()
	}
	close(start)
	wg.Wait()
	replays := 0
	for i, adm := range adms {
		if errs[i] != nil {
			t.Fatalf("POST %d: %v", i, errs[i])
		}
		defer adm.Sub.Close()
		if adm.ID != adms[0].ID {
			t.Fatalf("POST %d follows %s, POST 0 %s", i, adm.ID, adms[0].ID)
		}
		if adm.Standing.Replayed {
			replays++
		}
	}
	in := s.temporal.only(t).in
	if in.RequestID != adms[0].ID || replays != n-1 {
		t.Fatalf("started %s; %d replays of %d POSTs", in.RequestID, replays, n)
	}
	near(t, "tokens charged", s.charged(), float64(s.bound("hello")+100))
	near(t, "requests charged", meteredTier().Tenant.RequestBurst-s.tenantRequests(), 1)
	if st := s.streams(); st != 1 {
		t.Errorf("%d streams, want the winner's", st)
	}
}

// A replay attaches but is not free: each one is charged to its tier's
// resumes limit, as a resume is, and once that is spent the replays are
// refused (no attach, no signal) while the chat's buckets stay as the
// first POST left them.
func TestReplaysCountAgainstTheResumesLimit(t *testing.T) {
	const perMinute = 3
	s := newStack(t, func(c *config.Config) {
		setTier(c, func(t *policy.Tier) { t.Routes.Resumes = policy.RouteRate{TenantPerMinute: perMinute} })
	})
	first := s.admit(acme, s.keyed("k1", "hello"))
	charged, requests := s.charged(), s.tenantRequests()
	for i := range perMinute {
		adm := s.admit(acme, s.keyed("k1", "hello"))
		if adm.ID != first.ID || !adm.Standing.Replayed {
			t.Fatalf("replay %d: %+v, want a replay of %s", i, adm, first.ID)
		}
		if r := adm.Standing.Requests; r == nil || r.Remaining != float64(perMinute-1-i) {
			t.Errorf("replay %d: standing %+v, want %d resumes left", i, r, perMinute-1-i)
		}
	}
	signals := s.temporal.signals.Load()
	for i := range 20 {
		adm, err := s.door.Admit(context.Background(), acme, s.keyed("k1", "hello"))
		e := refusalOf(t, err)
		if e.Class != refusal.Limited || e.Code != request.ReasonRateLimited || e.RetryAfter < 1 ||
			!strings.Contains(e.Message, policy.RouteResumes) || adm.Sub != nil || adm.Standing.Replayed {
			t.Fatalf("replay %d past the limit: refused %+v, admission %+v", perMinute+i, e, adm)
		}
	}
	if n := s.temporal.signals.Load(); n != signals {
		t.Errorf("%d signals sent for refused replays", n-signals)
	}
	if n := len(s.temporal.inputs()); n != 1 {
		t.Errorf("%d workflows started, want 1", n)
	}
	near(t, "tokens charged", s.charged(), charged)
	near(t, "chat requests bucket", s.tenantRequests(), requests)
}
