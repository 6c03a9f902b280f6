package door_test

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
)

// holding is what acme holds at the door, to compare before and after
// a refusal: its rate-limit buckets, its month, its places in the fair
// order and entries in the queues, the event streams and the workflows
// started.
type holding struct {
	tokens, requests float64
	month            int64
	places, streams  int
	starts           int
	// queued are acme's entries in the pools' queues.
	queued int
}

func (s *stack) holding() holding {
	h := holding{tokens: s.tenantTokens(), requests: s.tenantRequests(), month: s.budgetUsed("acme").Tokens,
		places: s.placesReserved("acme"), streams: s.streams(), starts: len(s.temporal.inputs())}
	for _, pool := range []string{request.PoolShort, request.PoolLong} {
		_, mine, err := s.gate.Depth(context.Background(), pool, "acme")
		if err != nil {
			s.t.Fatal(err)
		}
		h.queued += mine
	}
	return h
}

// sessionReq is a validated request of acme's session s1.
func (s *stack) sessionReq() *door.Request {
	req := s.request("hello", 100)
	req.SessionID = "s1"
	return req
}

// fill enqueues n requests of tenant in pool, as other instances'
// workflows would: with the pool's permits taken, the rest wait.
func (s *stack) fill(pool, tenant string, n int) []string {
	s.t.Helper()
	var ids []string
	for i := range n {
		id := tenant + "-" + string(rune('a'+i))
		if _, err := s.gate.Enqueue(context.Background(), pool, admission.Request{ID: id, Tenant: tenant, Weight: 1, Cost: 1}); err != nil {
			s.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// onePermit gives each pool one permit, and queue_per_permit 1: a second
// request waiting in a pool fills it.
func onePermit(c *config.Config) {
	c.Pools.Short.MaxConcurrency, c.Pools.Long.MaxConcurrency = 1, 1
	c.API.QueuePerPermit = 1
}

// Every refusal of Admit after the request was charged gives back what
// it took: the rate-limit buckets, the month and the place in the fair
// order are where they were, no stream is left and nothing starts. A
// refusal for want of capacity is recorded in the request's session; one
// by a limit is not. Each is counted and logged once.
func TestAdmitRefusals(t *testing.T) {
	cases := []struct {
		name  string
		mod   func(*config.Config)
		with  deps
		setup func(t *testing.T, s *stack)
		req   func(s *stack) *door.Request
		class refusal.Class
		code  string
		// outcome is the refusal's sluice_requests_total label ("": not
		// counted); recorded, whether it is in the session.
		outcome  string
		recorded bool
		check    func(t *testing.T, s *stack, st door.Standing, e *refusal.Error)
	}{{
		name: "the tenant's requests are used up",
		mod: func(c *config.Config) {
			tier := meteredTier()
			tier.Tenant.RequestBurst = 1
			c.Limits.Tiers["metered"] = tier
		},
		setup: func(t *testing.T, s *stack) { s.admit(acme, s.sessionReq()) },
		class: refusal.Limited, code: request.ReasonRateLimited, outcome: "rejected_rate",
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			if e.Dimension != "tenant" || e.Kind != "requests" || e.RetryAfter < 90 || e.RetryAfter > 100 {
				t.Errorf("refused by %s %s, retry in %d s; want tenant requests, in about 100 s", e.Dimension, e.Kind, e.RetryAfter)
			}
			first := meteredTier().Tenant.TokenBurst - s.tenantTokens()
			if st.Requests == nil || st.Requests.Limit != 1 || st.Requests.Remaining != 0 || st.Tokens == nil ||
				st.Tokens.Limit != 100000 || st.Tokens.Remaining < 100000-first-1 || st.Tokens.Remaining > 100000-first {
				t.Errorf("standing tokens %+v requests %+v", st.Tokens, st.Requests)
			}
		},
	}, {
		name: "the request needs more tokens than the bucket holds",
		mod: func(c *config.Config) {
			tier := meteredTier()
			tier.Tenant.TokenBurst = 100
			c.Limits.Tiers["metered"] = tier
		},
		class: refusal.TooLarge, code: "request_too_large", outcome: "",
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			if e.Dimension != "tenant" || e.Kind != "tokens" || e.RetryAfter != 0 || !strings.Contains(e.Message, "never holds more than 100") {
				t.Errorf("refusal %+v", e)
			}
		},
	}, {
		name:  "the month's token budget is used up; the rate charge is given back",
		mod:   withBudget(policy.Budget{TokensPerMonth: 2000}),
		setup: func(t *testing.T, s *stack) { s.admit(acme, s.sessionReq()) },
		class: refusal.Limited, code: request.ReasonBudgetExceeded, outcome: "rejected_budget_exceeded",
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			used := s.budgetUsed("acme").Tokens
			if used > 2000 || 2*used <= 2000 {
				t.Fatalf("the first request used %d tokens: the test needs between 1000 and 2000", used)
			}
			_, next := monthOf(time.Now())
			if e.Kind != "tokens" || e.Dimension != "tenant" || e.RetryAfter <= 0 || e.RetryAfter > int(time.Until(next).Seconds())+1 {
				t.Errorf("refusal %+v, want tokens, retry at the month's end", e)
			}
			if m := st.Month; m == nil || m.Tokens != 2000 || m.TokensLeft != 2000-used || !m.Resets.Equal(next) {
				t.Errorf("month %+v, want 2000 tokens, %d left, resets %s", m, 2000-used, next)
			}
			if st.Tokens == nil {
				t.Error("the rate limits' standing is not told")
			}
		},
	}, {
		name: "the month's spend budget is used up",
		mod: func(c *config.Config) {
			withBudget(policy.Budget{SpendPerMonthUSD: 2})(c)
			c.Prices = config.Prices{"sluice-sim": {InputPerMillionUSD: 1000, OutputPerMillionUSD: 1000}}
		},
		setup: func(t *testing.T, s *stack) { s.admit(acme, s.sessionReq()) },
		class: refusal.Limited, code: request.ReasonBudgetExceeded, outcome: "rejected_budget_exceeded",
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			spent := float64(s.budgetUsed("acme").Tokens) * 1000 / 1e6
			if m := st.Month; e.Kind != "spend" || m == nil || m.SpendUSD != 2 || m.Tokens != 0 || m.SpendLeftUSD < 2-spent-1e-6 || m.SpendLeftUSD > 2-spent+1e-6 {
				t.Errorf("refused %s, month %+v; want spend, $%.6f left", e.Kind, m, 2-spent)
			}
		},
	}, {
		name: "the kb does not exist",
		req: func(s *stack) *door.Request {
			req := s.sessionReq()
			req.KB = "nope"
			return req
		},
		class: refusal.Invalid, code: "unknown_kb",
	}, {
		name:  "the rate limiter cannot be reached",
		with:  deps{limiterAddr: closedAddr(t)},
		class: refusal.Unavailable, code: request.ReasonUnavailable,
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			if e.RetryAfter != 1 {
				t.Errorf("retry in %d s, want 1", e.RetryAfter)
			}
		},
	}, {
		name: "the pool's queue is full",
		mod: func(c *config.Config) {
			onePermit(c)
			c.Admission.MaxQueueDepth = 1
		},
		setup: func(t *testing.T, s *stack) { s.fill(request.PoolShort, "other", 2) },
		class: refusal.Unavailable, code: request.ReasonQueueFull, outcome: "rejected_queue_full", recorded: true,
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			if want := request.Refused(request.ReasonQueueFull, s.cfg.Admission.RecheckInterval); e.RetryAfter != 2 || e.Message != want.Message || st.Tokens == nil {
				t.Errorf("refused %+v, standing %+v; want %+v, retry in the recheck interval", e, st, want)
			}
		},
	}, {
		name: "more wait is ahead than the deadline of a class that refuses late requests leaves",
		mod: func(c *config.Config) {
			onePermit(c)
			c.API.QueuePerPermit = 3
			setTier(c, func(t *policy.Tier) {
				t.Classes = map[string]policy.ClassLimits{request.ClassDefault: {Weight: 1, TTFTSLO: time.Second, RefuseLate: true}}
			})
		},
		setup: func(t *testing.T, s *stack) {
			// The pool's one permit turns over every 400 ms, and three of
			// acme's own are queued ahead: 1.6 s, more than its 1 s.
			s.fill(request.PoolShort, "other", 1)
			time.Sleep(400 * time.Millisecond)
			s.release("other-a")
			s.fill(request.PoolShort, "acme", 4)
		},
		class: refusal.Unavailable, code: request.ReasonDeadlineUnreachable, outcome: "rejected_deadline_unreachable", recorded: true,
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			if e.RetryAfter < 1 || !strings.Contains(e.Message, "of waiting is ahead of it") || !strings.Contains(e.Message, "default class's time to first token of 1s") {
				t.Errorf("refused %+v, want the wait ahead and the deadline named, with a retry", e)
			}
		},
	}, {
		name:  "the tenant's share of the queue is full",
		mod:   func(c *config.Config) { onePermit(c); setTier(c, func(t *policy.Tier) { t.MaxQueuePerTenant = 1 }) },
		setup: func(t *testing.T, s *stack) { s.fill(request.PoolShort, "acme", 2) },
		class: refusal.Unavailable, code: request.ReasonTenantQueueFull, outcome: "rejected_tenant_queue_full", recorded: true,
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			if want := request.Refused(request.ReasonTenantQueueFull, s.cfg.Admission.RecheckInterval); e.RetryAfter != 2 || e.Message != want.Message {
				t.Errorf("refused %+v, want %+v", e, want)
			}
		},
	}, {
		name: "the waiting room is full; the place reserved in the fair order is given back",
		mod: func(c *config.Config) {
			onePermit(c)
			c.API.WaitingRoom = 0
		},
		setup: func(t *testing.T, s *stack) { s.fill(request.PoolShort, "acme", 2) },
		class: refusal.Unavailable, code: request.ReasonBusy, outcome: "rejected_busy", recorded: true,
		check: func(t *testing.T, s *stack, st door.Standing, e *refusal.Error) {
			if e.RetryAfter != 1 {
				t.Errorf("retry in %d s, want 1", e.RetryAfter)
			}
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, c.mod, c.with)
			if c.setup != nil {
				c.setup(t, s)
			}
			req := s.sessionReq()
			if c.req != nil {
				req = c.req(s)
			}
			before := s.holding()
			adm, err := s.door.Admit(context.Background(), acme, req)
			e := refusalOf(t, err)
			if e.Class != c.class || e.Code != c.code || e.Message == "" {
				t.Fatalf("refused %v %s (%q), want %v %s", e.Class, e.Code, e.Message, c.class, c.code)
			}
			if adm.ID != "" || adm.Sub != nil || adm.Standing.Replayed {
				t.Fatalf("a refused request has id %q, a subscription %v, replayed %v", adm.ID, adm.Sub != nil, adm.Standing.Replayed)
			}
			after := s.holding()
			near(t, "tokens bucket", after.tokens, before.tokens)
			near(t, "requests bucket", after.requests, before.requests)
			if after.month != before.month || after.places != before.places || after.streams != before.streams || after.starts != before.starts ||
				after.queued != before.queued {
				t.Errorf("held %+v after the refusal, %+v before", after, before)
			}
			turns, err := s.sessions.Turns(context.Background(), session.Owner{Tenant: "acme", User: "ann"}, "s1")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.recorded && (len(turns) != 1 || turns[0].Reason != c.code || turns[0].Outcome != request.OutcomeRejected || turns[0].Query != "hello"):
				t.Errorf("session turns %+v, want the refusal", turns)
			case !c.recorded && len(turns) != 0:
				t.Errorf("session turns %+v, want none", turns)
			}
			if c.outcome != "" {
				if n := s.counted(c.outcome); n != 1 {
					t.Errorf("counted %v times as %s", n, c.outcome)
				}
				lines := s.finished(c.code)
				if len(lines) != 1 || lines[0]["outcome"] != request.OutcomeRejected || lines[0]["tenant"] != "acme" || lines[0]["route"] != request.PoolShort {
					t.Errorf("request finished lines %v, want one, rejected", lines)
				}
			}
			if c.check != nil {
				c.check(t, s, adm.Standing, e)
			}
		})
	}
}

// setTier changes the metered tier.
func setTier(c *config.Config, change func(*policy.Tier)) {
	tier := c.Limits.Tiers["metered"]
	change(&tier)
	c.Limits.Tiers["metered"] = tier
}

// monthOf is the UTC month of t.
func monthOf(t time.Time) (start, next time.Time) {
	t = t.UTC()
	start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 1, 0)
}

// closedAddr is a loopback address nothing listens on: a connection to it
// is refused at once.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// silentAddr is a loopback address that takes connections and never
// answers: a Redis that stalls.
func silentAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(io.Discard, conn)
				_ = conn.Close()
			}()
		}
	}()
	return ln.Addr().String()
}
