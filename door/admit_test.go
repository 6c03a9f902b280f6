package door_test

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/workflows"
)

// bound is the prompt bound the door routes a query by: the query and
// top_k full chunks.
func (s *stack) bound(query string) int {
	return s.prompts.BoundForQueryTokens(s.prompts.QueryTokens(query), s.cfg.Retrieval.TopK, s.cfg.Retrieval.ChunkTokens)
}

// charged is what acme's tenant tokens bucket was charged so far.
func (s *stack) charged() float64 { return meteredTier().Tenant.TokenBurst - s.tenantTokens() }

// A request admitted at once starts its workflow with what the door
// decided: its pool, its prompt's bound, its caps, its reservations, its
// size in the fair order and its tier's settings; and it is told where it
// stands.
func TestAdmittedAtOnce(t *testing.T) {
	longQuery := strings.Repeat("permit ", 200)
	cases := []struct {
		name  string
		mod   func(*config.Config)
		who   func(door.Caller) door.Caller
		setup func(s *stack)
		req   func(s *stack) *door.Request
		check func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput)
	}{{
		name: "a short query goes to the short pool with its reservations and tier's settings",
		req:  func(s *stack) *door.Request { return s.request("What is a permit?", 16) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			b := s.bound("What is a permit?")
			if in.Pool != request.PoolShort || adm.Pool != request.PoolShort || in.PromptBound != b {
				t.Errorf("pool %s (admission says %s), prompt bound %d; want short, %d", in.Pool, adm.Pool, in.PromptBound, b)
			}
			if in.MaxTokens != 16 || in.AdmissionTokens != b || in.Choices != 0 {
				t.Errorf("max tokens %d, admission tokens %d, choices %d; want 16, %d (the prompt's bound), 0", in.MaxTokens, in.AdmissionTokens, in.Choices, b)
			}
			if in.RateReservation == "" || in.BudgetReservation != "" || in.AdmissionPlace.Tag != 0 || in.Fallback != nil {
				t.Errorf("rate %q budget %q place %+v fallback %v: want a rate reservation only", in.RateReservation, in.BudgetReservation, in.AdmissionPlace, in.Fallback)
			}
			want := workflows.ChatInput{RequestID: adm.ID, Tenant: "acme", User: "ann", KeyID: "key-acme", Tier: "metered",
				Query: "What is a permit?", KB: "sluice-docs"}
			if in.RequestID != want.RequestID || in.Tenant != want.Tenant || in.User != want.User || in.KeyID != want.KeyID ||
				in.Tier != want.Tier || in.Query != want.Query || in.KB != want.KB || in.KBTenant != "" || in.SessionID != "" {
				t.Errorf("input names %+v", in)
			}
			tier := meteredTier()
			st := in.Settings
			if st.MaxWait != tier.MaxWait || st.MaxWaitByPool != nil || st.Weight != tier.Weight || st.MaxPerTenant != tier.MaxQueuePerTenant ||
				st.MaxConcurrent != tier.MaxConcurrent || !st.AnswerCache {
				t.Errorf("settings %+v: want the metered tier's, with the answer cache", st)
			}
			near(t, "tokens charged", s.charged(), float64(b+16))
			near(t, "requests charged", meteredTier().Tenant.RequestBurst-s.tenantRequests(), 1)
			tok, reqs := adm.Standing.Tokens, adm.Standing.Requests
			if tok == nil || reqs == nil || tok.Limit != 100000 || tok.Remaining != math.Floor(100000-float64(b+16)) ||
				reqs.Limit != 100 || reqs.Remaining != 99 || adm.Standing.Month != nil || adm.Standing.Replayed {
				t.Errorf("standing %+v tokens %+v requests %+v", adm.Standing, tok, reqs)
			}
		},
	}, {
		name: "a long query goes to the long pool",
		req:  func(s *stack) *door.Request { return s.request(longQuery, 16) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			// Counted as validated: trimmed.
			b := s.bound(strings.TrimSpace(longQuery))
			if in.Pool != request.PoolLong || adm.Pool != request.PoolLong || in.PromptBound != b {
				t.Errorf("pool %s, bound %d; want long, %d", in.Pool, in.PromptBound, b)
			}
		},
	}, {
		name: "a session's turns route a short query long and keep it out of the answer cache",
		setup: func(s *stack) {
			err := s.sessions.Append(context.Background(), session.Owner{Tenant: "acme", User: "ann"}, "s1", session.Turn{
				RequestID: "r0", Query: "tell me everything", Answer: strings.Repeat("lease ", 300), Outcome: request.OutcomeDone, At: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
		},
		req: func(s *stack) *door.Request {
			req := s.request("and then?", 16)
			req.SessionID = "s1"
			return req
		},
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			if in.Pool != request.PoolLong || in.SessionID != "s1" || in.Settings.AnswerCache {
				t.Errorf("pool %s session %q answer cache %v; want long, s1, no cache", in.Pool, in.SessionID, in.Settings.AnswerCache)
			}
			// The charge covers the whole session budget, not just the
			// turns there are.
			near(t, "tokens charged", s.charged(), float64(s.bound("and then?")+16+s.cfg.Sessions.HistoryTokens))
		},
	}, {
		name: "the tier's max output tokens cap max_tokens",
		mod: func(c *config.Config) {
			tier := meteredTier()
			tier.MaxOutputTokens = 64
			c.Limits.Tiers["capped"] = tier
		},
		who: func(c door.Caller) door.Caller { c.Tier = "capped"; return c },
		req: func(s *stack) *door.Request { return s.request("hello", 1000) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			b := s.bound("hello")
			if in.MaxTokens != 64 || in.AdmissionTokens != b {
				t.Errorf("max tokens %d admission tokens %d, want 64, %d", in.MaxTokens, in.AdmissionTokens, b)
			}
			near(t, "tokens charged", s.charged(), float64(b+64))
		},
	}, {
		name: "the fair order places a request at its prompt alone (its output is charged as it streams); the rate limits charge the bound",
		mod:  func(c *config.Config) { c.Admission.OutputTokenWeight = 2.5 },
		req:  func(s *stack) *door.Request { return s.request("hello", 100) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			b := s.bound("hello")
			if in.AdmissionTokens != b {
				t.Errorf("admission tokens %d, want %d", in.AdmissionTokens, b)
			}
			near(t, "tokens charged", s.charged(), float64(b+100))
		},
	}, {
		name: "while long requests are throttled, a long one is charged the factor times its tokens",
		setup: func(s *stack) {
			if _, err := s.policy.Update(context.Background(), func(p *policy.Policy) bool { p.LongCostFactor = 2.5; return true }); err != nil {
				t.Fatal(err)
			}
		},
		req: func(s *stack) *door.Request { return s.request(longQuery, 16) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			b := s.bound(strings.TrimSpace(longQuery))
			if in.Pool != request.PoolLong || in.AdmissionTokens != b {
				t.Errorf("pool %s admission tokens %d, want long, %d: the factor is the rate limits' only", in.Pool, in.AdmissionTokens, b)
			}
			near(t, "tokens charged", s.charged(), math.Ceil(2.5*float64(b+16)))
		},
	}, {
		name: "a throttled long pool charges a short request as usual",
		setup: func(s *stack) {
			if _, err := s.policy.Update(context.Background(), func(p *policy.Policy) bool { p.LongCostFactor = 2.5; return true }); err != nil {
				t.Fatal(err)
			}
		},
		req: func(s *stack) *door.Request { return s.request("hello", 16) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			near(t, "tokens charged", s.charged(), float64(s.bound("hello")+16))
		},
	}, {
		name: "a tier with a budget reserves it and hears of its month",
		mod:  withBudget(policy.Budget{TokensPerMonth: 50000}),
		req:  func(s *stack) *door.Request { return s.request("hello", 100) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			cost := int64(s.bound("hello") + 100)
			m := adm.Standing.Month
			if in.BudgetReservation == "" || m == nil || m.Tokens != 50000 || m.TokensLeft != 50000-cost || m.SpendUSD != 0 || m.Resets.Before(time.Now()) {
				t.Errorf("budget reservation %q, month %+v; want 50000 tokens, %d left", in.BudgetReservation, m, 50000-cost)
			}
			if used := s.budgetUsed("acme"); used.Tokens != cost {
				t.Errorf("month used %d tokens, want %d", used.Tokens, cost)
			}
		},
	}, {
		name: "limits off: nothing is charged",
		mod:  func(c *config.Config) { c.Limits.Enabled = false },
		req:  func(s *stack) *door.Request { return s.request("hello", 16) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			if in.RateReservation != "" || adm.Standing.Tokens != nil || adm.Standing.Requests != nil {
				t.Errorf("reservation %q, standing %+v", in.RateReservation, adm.Standing)
			}
			if _, ok := s.level("tenant", "acme", "tokens"); ok {
				t.Error("a bucket was charged")
			}
		},
	}, {
		name: "a tenant's own kb is resolved for its workflow, and not answered from the cache",
		setup: func(s *stack) {
			putDocs(t, s, kbref.Own("acme", "handbook"), kbstore.Revision{ID: "d1", Rev: "r1", Title: "t", Chunks: []string{"x"}, Vectors: []float32{1}, Dims: 1})
		},
		req: func(s *stack) *door.Request {
			req := s.request("hello", 16)
			req.KB = "handbook"
			return req
		},
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			if in.KB != "handbook" || in.KBTenant != "acme" || in.Settings.AnswerCache {
				t.Errorf("kb %q of %q, answer cache %v", in.KB, in.KBTenant, in.Settings.AnswerCache)
			}
		},
	}, {
		name: "a gateway request is its conversation, routed by its length, never cached",
		req: func(s *stack) *door.Request {
			req := &door.Request{Conversation: conversation("hello there"), Gateway: true, Model: "sluice-sim", MaxTokens: intp(16), Choices: 2}
			if err := s.door.Validate(req); err != nil {
				t.Fatal(err)
			}
			return req
		},
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			b := s.prompts.Count(conversation("hello there"))
			if !in.Gateway || len(in.Conversation) != 1 || in.Pool != request.PoolShort || in.PromptBound != b || in.Settings.AnswerCache {
				t.Errorf("gateway %v, %d messages, pool %s, bound %d (want %d), cache %v", in.Gateway, len(in.Conversation), in.Pool, in.PromptBound, b, in.Settings.AnswerCache)
			}
			if in.Choices != 2 || in.AdmissionTokens != b {
				t.Errorf("choices %d admission tokens %d, want 2, placed at the prompt's %d", in.Choices, in.AdmissionTokens, b)
			}
			near(t, "tokens charged", s.charged(), float64(b+32))
		},
	}, {
		name: "a model's own pool answers it, whatever the prompt's length routes",
		mod:  twoModels(false),
		req:  func(s *stack) *door.Request { return s.gateway("big", "hi") },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			if in.Pool != request.PoolLong || adm.Pool != request.PoolLong || in.Fallback != nil {
				t.Errorf("pool %s, fallback %+v; want long, none", in.Pool, in.Fallback)
			}
		},
	}, {
		name: "a prompt too long for its model's pool goes to the pool's fallback",
		mod:  twoModels(true),
		req:  func(s *stack) *door.Request { return s.gateway("small", strings.Repeat("word ", 700)) },
		check: func(t *testing.T, s *stack, adm door.Admission, in workflows.ChatInput) {
			want := events.Fallback{From: "small", To: "big", FromPool: request.PoolShort, ToPool: request.PoolLong, Reason: request.FallbackContextTooLong}
			if in.Pool != request.PoolLong || in.Fallback == nil || *in.Fallback != want {
				t.Errorf("pool %s fallback %+v, want long and %+v", in.Pool, in.Fallback, want)
			}
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, c.mod)
			if c.setup != nil {
				c.setup(s)
			}
			who := acme
			if c.who != nil {
				who = c.who(who)
			}
			adm := s.admit(who, c.req(s))
			st := s.temporal.only(t)
			if !door.ValidRequestID(adm.ID) || st.in.RequestID != adm.ID || st.opts.ID != workflows.ChatWorkflowID(adm.ID) ||
				st.opts.TaskQueue != s.cfg.Temporal.TaskQueue {
				t.Fatalf("admitted %q, started %q as %q on %q", adm.ID, st.in.RequestID, st.opts.ID, st.opts.TaskQueue)
			}
			c.check(t, s, adm, st.in)
			first := firstEvent(t, adm.Sub)
			var acc events.Accepted
			if first.Type != events.TypeAccepted || json.Unmarshal(first.Data, &acc) != nil || acc.RequestID != adm.ID || acc.Tenant != "acme" {
				t.Errorf("first event %s %s, want accepted for %s", first.Type, first.Data, adm.ID)
			}
			if n := s.counted("rejected_rate"); n != 0 {
				t.Errorf("%v admitted requests counted as refused", n)
			}
		})
	}
}

// withBudget gives the metered tier a monthly budget (which needs a
// usage ledger configured; the door itself never reads it).
func withBudget(b policy.Budget) func(*config.Config) {
	return func(c *config.Config) {
		tier := meteredTier()
		tier.Budget = b
		c.Limits.Tiers["metered"] = tier
		c.Usage.Store, c.Usage.SQLitePath = config.UsageSQLite, "unused.db"
	}
}

// twoModels serves model small on the short pool and big on the long,
// the short pool falling back on the long if fallback.
func twoModels(fallback bool) func(*config.Config) {
	return func(c *config.Config) {
		c.Pools.Short.Model, c.Pools.Long.Model = "small", "big"
		if fallback {
			c.Pools.Short.Fallbacks = []config.Fallback{{Pool: request.PoolLong}}
		}
	}
}

// gateway is a validated gateway request to model of one user message.
func (s *stack) gateway(model, text string) *door.Request {
	s.t.Helper()
	req := &door.Request{Conversation: conversation(text), Gateway: true, Model: model, MaxTokens: intp(16)}
	if err := s.door.Validate(req); err != nil {
		s.t.Fatal(err)
	}
	return req
}

// putDocs writes revisions into kb, as ingestion does.
func putDocs(t *testing.T, s *stack, kb kbref.Ref, revs ...kbstore.Revision) {
	t.Helper()
	if _, err := s.kbs.Put(context.Background(), kb.Key(), "m", revs); err != nil {
		t.Fatal(err)
	}
}

// firstEvent is the first event sub delivers.
func firstEvent(t *testing.T, sub *events.Subscription) events.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := sub.Next(ctx)
	if err != nil || len(evs) == 0 {
		t.Fatalf("subscription: %v", err)
	}
	return evs[0]
}

// A sampling parameter, content part or n the pool's backend cannot take
// is refused naming it, before anything is charged.
func TestUnsupportedParameterRefusedBeforeCharging(t *testing.T) {
	temp := 0.5
	cases := []struct {
		name, param string
		req         door.Request
	}{
		{"sampling", "logit_bias", door.Request{Sampling: &openai.Sampling{LogitBias: map[string]float64{"1": 2}, Temperature: &temp}}},
		{"content part", "image_url", door.Request{PartTypes: []string{"image_url"}}},
		{"several answers", "n", door.Request{Choices: 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStack(t, func(cfg *config.Config) {
				cfg.Pools.Short.Unsupported = []string{"logit_bias", "image_url", "n"}
			})
			req := c.req
			req.Conversation, req.Gateway, req.Model, req.MaxTokens = conversation("hi"), true, "sluice-sim", intp(16)
			if err := s.door.Validate(&req); err != nil {
				t.Fatal(err)
			}
			_, err := s.door.Admit(context.Background(), acme, &req)
			e := refusalOf(t, err)
			if e.Class != refusal.Invalid || e.Code != "unsupported_parameter" || e.Param != c.param || !strings.Contains(e.Message, "sluice-sim") {
				t.Fatalf("refused %+v, want unsupported_parameter naming %s", e, c.param)
			}
			if _, charged := s.level("tenant", "acme", "tokens"); charged || len(s.temporal.inputs()) != 0 || s.streams() != 0 {
				t.Fatal("a request refused for its parameters was charged, started or given a stream")
			}
		})
	}
}

// A prompt too long for its model's pool, which has no fallback that
// takes it, is refused as OpenAI refuses it, before anything is charged.
func TestPromptTooLongForItsModelRefused(t *testing.T) {
	s := newStack(t, twoModels(false))
	_, err := s.door.Admit(context.Background(), acme, s.gateway("small", strings.Repeat("word ", 700)))
	e := refusalOf(t, err)
	if e.Class != refusal.Invalid || e.Code != "context_length_exceeded" || e.Param != "messages" || !strings.Contains(e.Message, "maximum context length is 512") {
		t.Fatalf("refused %+v", e)
	}
	if _, charged := s.level("tenant", "acme", "tokens"); charged || len(s.temporal.inputs()) != 0 {
		t.Fatal("charged or started")
	}
}
