package door_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// A ban store that does not answer lets the request through its ban
// check, but having waited redis.request_timeout for it, the door
// refuses at once rather than wait as long again on the same Redis; one
// that answers with an error lets the request all the way through.
func TestBanStoreDown(t *testing.T) {
	cases := []struct {
		name     string
		addr     func(t *testing.T) string
		admitted bool
	}{
		{"silent: the caller is refused at once", silentAddr, false},
		{"answering errors: the caller goes on", lockedRedis, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, nil, deps{banAddr: c.addr(t)})
			who := acme
			began := time.Now()
			if err := s.door.CheckBans(context.Background(), &who); err != nil {
				t.Fatalf("a ban store that is down refused: %v", err)
			}
			if waited := time.Since(began); waited > 2*s.cfg.Redis.RequestTimeout {
				t.Fatalf("the ban check took %s, more than its bound %s", waited, s.cfg.Redis.RequestTimeout)
			}
			began = time.Now()
			adm, err := s.door.Admit(context.Background(), who, s.request("hello", 100))
			if c.admitted {
				if err != nil {
					t.Fatal(err)
				}
				adm.Sub.Close()
				return
			}
			e := refusalOf(t, err)
			if e.Class != refusal.Unavailable || e.Code != request.ReasonUnavailable || e.RetryAfter != 1 {
				t.Fatalf("refused %+v, want unavailable, retry in 1 s", e)
			}
			if took := time.Since(began); took > s.cfg.Redis.RequestTimeout/2 {
				t.Errorf("refusing took %s: it waited again", took)
			}
			if _, charged := s.level("tenant", "acme", limiter.Tokens); charged || s.streams() != 0 || len(s.temporal.inputs()) != 0 {
				t.Error("a refused caller was charged, given a stream or started")
			}
			// The mark is the caller's, not the door's: another request
			// is admitted.
			if adm := s.admit(acme, s.request("hello", 100)); adm.ID == "" {
				t.Error("an unmarked caller was refused")
			}
		})
	}
}

// A caller whose key or address was banned (more refused credentials
// than limits.ban.threshold, 2 here) is refused, with what is left of the
// ban as Retry-After; strikes up to the threshold ban nothing, and a ban
// names only what it banned.
func TestBans(t *testing.T) {
	badKey := door.Caller{Tenant: "acme", KeyID: "key-guessed", IP: "203.0.113.9"}
	cases := []struct {
		name    string
		strikes int
		// struck is who the strikes were counted against; asking, who
		// asks after.
		struck, asking door.Caller
		banned         bool
		what           string
	}{
		{"three refused credentials ban the key", 3, door.Caller{KeyID: "key-guessed"}, badKey, true, "API key"},
		{"three refused credentials ban the address", 3, door.Caller{IP: "203.0.113.9"}, door.Caller{IP: "203.0.113.9"}, true, "client address"},
		{"two, the threshold, ban nothing", 2, badKey, badKey, false, ""},
		{"a banned key does not ban another", 3, door.Caller{KeyID: "key-guessed"}, acme, false, ""},
		{"a banned address does not ban another", 3, door.Caller{IP: "203.0.113.9"}, door.Caller{IP: "203.0.113.10"}, false, ""},
		{"loopback is exempt", 3, door.Caller{IP: "127.0.0.1"}, door.Caller{IP: "127.0.0.1"}, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, nil)
			ctx := context.Background()
			for range c.strikes {
				s.door.RefusedCredential(ctx, c.struck, "/v1/chat")
			}
			who := c.asking
			err := s.door.CheckBans(ctx, &who)
			if !c.banned {
				if err != nil {
					t.Fatalf("refused %v", err)
				}
				return
			}
			e := refusalOf(t, err)
			limit := int(s.cfg.Limits.Ban.Duration.Seconds())
			if e.Class != refusal.Limited || e.Code != "banned" || e.RetryAfter < limit-2 || e.RetryAfter > limit || !strings.Contains(e.Message, c.what) {
				t.Fatalf("refused %+v, want banned %s for about %d s", e, c.what, limit)
			}
			if !strings.Contains(s.logs.String(), "banned for abuse") {
				t.Error("the ban is not logged")
			}
		})
	}
}

// A client that keeps coming back before the Retry-After a rate limit
// gave it, past the grace for requests already in flight, is banned.
func TestIgnoringRetryAfterEarnsABan(t *testing.T) {
	s := newStack(t, func(c *config.Config) {
		setTier(c, func(t *policy.Tier) { t.Routes.Reads = policy.RouteRate{TenantPerMinute: 1} })
	})
	ctx := context.Background()
	who := acme
	who.IP = "203.0.113.9"
	if _, err := s.door.LimitRoute(ctx, who, policy.RouteReads); err != nil {
		t.Fatal(err)
	}
	// Told to wait; what is in flight within the grace is no strike.
	for range 2 {
		if _, err := s.door.LimitRoute(ctx, who, policy.RouteReads); err == nil {
			t.Fatal("the route's limit let a second request through")
		}
	}
	if err := s.door.CheckBans(ctx, &who); err != nil {
		t.Fatalf("banned within the grace: %v", err)
	}
	time.Sleep(1100 * time.Millisecond)
	for range 3 {
		_, _ = s.door.LimitRoute(ctx, who, policy.RouteReads)
	}
	if e := refusalOf(t, s.door.CheckBans(ctx, &who)); e.Code != "banned" {
		t.Fatalf("refused %+v, want banned", e)
	}
}

// lockedRedis is a Redis that wants a password the test's clients do not
// send: it answers every command at once, with an error.
func lockedRedis(t *testing.T) string {
	return testenv.StartRedis(t, "--requirepass", "not-the-tests").Addr
}

// Tokens charged outside the chat path (an embeddings call) count against
// the chat's buckets, tell where the caller stands and come back whole
// with Refund.
func TestChargeTokensAndRefund(t *testing.T) {
	cases := []struct {
		name   string
		mod    func(*config.Config)
		before int // tokens charged first, allowed
		tokens int
		class  refusal.Class
		code   string
		check  func(t *testing.T, s *stack, st door.Standing)
	}{{
		name: "charged, then refunded", tokens: 500,
		check: func(t *testing.T, s *stack, st door.Standing) {
			if st.Tokens == nil || st.Tokens.Limit != 100000 || st.Tokens.Remaining != 99500 || st.Requests == nil || st.Requests.Remaining != 99 {
				t.Errorf("standing tokens %+v requests %+v", st.Tokens, st.Requests)
			}
		},
	}, {
		name: "more tokens than the bucket holds", tokens: 200000, class: refusal.TooLarge, code: "request_too_large",
	}, {
		name: "the tenant's tokens are used up", before: 99800, tokens: 500, class: refusal.Limited, code: request.ReasonRateLimited,
		check: func(t *testing.T, s *stack, st door.Standing) {
			if st.Tokens == nil || st.Tokens.Remaining > 200 {
				t.Errorf("standing tokens %+v", st.Tokens)
			}
		},
	}, {
		name: "a tier that counts requests only charges no tokens", tokens: 500,
		mod: func(c *config.Config) {
			setTier(c, func(t *policy.Tier) { t.Tenant = policy.Rate{RequestsPerMinute: 0.6, RequestBurst: 100} })
		},
		check: func(t *testing.T, s *stack, st door.Standing) {
			if st.Tokens != nil || st.Requests == nil || st.Requests.Remaining != 99 {
				t.Errorf("standing tokens %+v requests %+v", st.Tokens, st.Requests)
			}
		},
	}, {
		name: "limits off", tokens: 500, mod: func(c *config.Config) { c.Limits.Enabled = false },
		check: func(t *testing.T, s *stack, st door.Standing) {
			if st.Tokens != nil || st.Requests != nil {
				t.Errorf("standing %+v", st)
			}
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, c.mod)
			ctx := context.Background()
			if c.before > 0 {
				if _, _, err := s.door.ChargeTokens(ctx, acme, c.before); err != nil {
					t.Fatal(err)
				}
			}
			before := s.holding()
			ch, st, err := s.door.ChargeTokens(ctx, acme, c.tokens)
			if !strings.HasPrefix(ch.ID, "emb-") || !door.ValidRequestID("chat-"+strings.TrimPrefix(ch.ID, "emb-")) {
				t.Errorf("charge id %q", ch.ID)
			}
			if c.check != nil {
				c.check(t, s, st)
			}
			if c.code != "" {
				e := refusalOf(t, err)
				if e.Class != c.class || e.Code != c.code {
					t.Fatalf("refused %v %s, want %v %s", e.Class, e.Code, c.class, c.code)
				}
				near(t, "tokens bucket after a refusal", s.tenantTokens(), before.tokens)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.cfg.Limits.Enabled && s.cfg.Limits.Tiers["metered"].Tenant.TokensPerMinute > 0 {
				near(t, "tokens bucket charged", s.tenantTokens(), before.tokens-float64(c.tokens))
			}
			s.door.Refund(ctx, ch)
			near(t, "tokens bucket refunded", s.tenantTokens(), before.tokens)
			near(t, "requests bucket refunded", s.tenantRequests(), before.requests)
		})
	}
}

// Each route besides the chat POSTs has buckets of its own, per tenant and
// per address, apart from the chat's and each other's.
func TestLimitRoute(t *testing.T) {
	s := newStack(t, func(c *config.Config) {
		setTier(c, func(t *policy.Tier) {
			t.Routes = policy.RouteLimits{Reads: policy.RouteRate{TenantPerMinute: 2, IPPerMinute: 3}, Resumes: policy.RouteRate{TenantPerMinute: 1}}
		})
	})
	ctx := context.Background()
	globex := acme
	globex.Tenant = "globex"
	steps := []struct {
		name      string
		who       door.Caller
		route     string
		code      string
		dimension string
		remaining float64
	}{
		{"first read", acme, policy.RouteReads, "", "", 1},
		{"second read", acme, policy.RouteReads, "", "", 0},
		{"third read: the tenant's reads are used up", acme, policy.RouteReads, request.ReasonRateLimited, "tenant", 0},
		{"resumes have their own buckets", acme, policy.RouteResumes, "", "", 0},
		{"another tenant's read, the address's third", globex, policy.RouteReads, "", "", 0},
		{"the address's reads are used up", globex, policy.RouteReads, request.ReasonRateLimited, "ip", 0},
		{"ingest is not limited in this tier", acme, policy.RouteIngest, "", "", -1},
	}
	for _, step := range steps {
		st, err := s.door.LimitRoute(ctx, step.who, step.route)
		if step.code != "" {
			e := refusalOf(t, err)
			if e.Class != refusal.Limited || e.Code != step.code || e.Dimension != step.dimension || e.Kind != "requests" ||
				e.RetryAfter < 1 || !strings.Contains(e.Message, step.route) {
				t.Errorf("%s: refused %+v, want %s by the %s limit naming %s", step.name, e, step.code, step.dimension, step.route)
			}
		} else if err != nil {
			t.Errorf("%s: refused %v", step.name, err)
		}
		switch {
		case step.remaining < 0 && st.Requests != nil:
			t.Errorf("%s: standing %+v for an unlimited route", step.name, st.Requests)
		case step.remaining >= 0 && (st.Requests == nil || st.Requests.Remaining != step.remaining):
			t.Errorf("%s: standing %+v, want %v left", step.name, st.Requests, step.remaining)
		}
	}
	if _, charged := s.level("tenant", "acme", limiter.Requests); charged {
		t.Error("a route's requests were charged to the chat's bucket")
	}
}

// The routes' limits fail open: a limiter that cannot be reached, or
// limits that are off, let the request through.
func TestLimitRouteFailsOpen(t *testing.T) {
	limited := func(c *config.Config) {
		setTier(c, func(t *policy.Tier) { t.Routes.Reads = policy.RouteRate{TenantPerMinute: 1} })
	}
	cases := []struct {
		name string
		mod  func(*config.Config)
		with deps
	}{
		{"limiter unreachable", func(c *config.Config) { limited(c); c.Redis.RequestTimeout = 100 * time.Millisecond }, deps{limiterAddr: closedAddr(t)}},
		{"limits off", func(c *config.Config) { limited(c); c.Limits.Enabled = false }, deps{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, c.mod, c.with)
			for i := range 3 {
				st, err := s.door.LimitRoute(context.Background(), acme, policy.RouteReads)
				if err != nil || st.Requests != nil {
					t.Fatalf("read %d: %v, standing %+v", i, err, st)
				}
			}
		})
	}
}
