package api

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// classConfig gives acme's key a tier that grants priority and flex,
// flex by default, and keeps a tier without classes for the refusals.
func classConfig(c *config.Config) {
	c.Auth.APIKeys[0].Tier = "gold"
	c.Limits.Tiers["gold"] = policy.Tier{Weight: 3, DefaultClass: request.ClassFlex, Classes: map[string]policy.ClassLimits{
		request.ClassPriority: {Weight: 9, TTFTSLO: time.Second, TPOTSLO: 50 * time.Millisecond},
		request.ClassFlex:     {Weight: 1},
	}}
}

// lastInput is the last workflow input the test client was asked to
// start, and how many it was asked for.
func lastInput(tc *countingClient) (workflows.ChatInput, int) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if len(tc.inputs) == 0 {
		return workflows.ChatInput{}, 0
	}
	return tc.inputs[len(tc.inputs)-1], len(tc.inputs)
}

// service_tier on either endpoint picks the class the request is served
// in, and the class's weight and SLOs, not the tier's, ride with it to
// admission; auto and none take the plan's default class.
func TestServiceTierPicksTheClassOnBothEndpoints(t *testing.T) {
	srv, tc, _ := newTestServer(t, classConfig)
	completion := func(tier string) string {
		return `{"model":"sluice-sim","messages":[{"role":"user","content":"hello"}],"stream":true` + tier + `}`
	}
	cases := []struct {
		name   string
		send   func() int
		class  string
		weight int
	}{
		{"chat priority", func() int { return post(srv, `{"query":"hello","service_tier":"priority"}`).Code }, request.ClassPriority, 9},
		{"chat auto", func() int { return post(srv, `{"query":"hello","service_tier":"auto"}`).Code }, request.ClassFlex, 1},
		{"chat none", func() int { return post(srv, `{"query":"hello"}`).Code }, request.ClassFlex, 1},
		{"completions priority", func() int { return postCompletion(srv, completion(`,"service_tier":"priority"`), nil).Code }, request.ClassPriority, 9},
		{"completions null", func() int { return postCompletion(srv, completion(`,"service_tier":null`), nil).Code }, request.ClassFlex, 1},
		{"completions flex", func() int { return postCompletion(srv, completion(`,"service_tier":"flex"`), nil).Code }, request.ClassFlex, 1},
	}
	for i, c := range cases {
		c.send()
		in, n := lastInput(tc)
		if n != i+1 {
			t.Fatalf("%s: %d starts, want %d", c.name, n, i+1)
		}
		if in.ServiceTier != c.class || in.Settings.Weight != c.weight {
			t.Errorf("%s: class %q weight %d, want %q weight %d", c.name, in.ServiceTier, in.Settings.Weight, c.class, c.weight)
		}
		wantTTFT := time.Duration(0)
		if c.class == request.ClassPriority {
			wantTTFT = time.Second
		}
		if in.Settings.TTFTSLO != wantTTFT {
			t.Errorf("%s: ttft slo %s, want %s", c.name, in.Settings.TTFTSLO, wantTTFT)
		}
	}
}

// A tier without classes serves everything in the default class at its
// own weight, as before classes; auto and default are its.
func TestTierWithoutClassesServesDefault(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) { c.Auth.APIKeys[0].Tier = "free" })
	for _, body := range []string{`{"query":"hello"}`, `{"query":"hello","service_tier":"auto"}`, `{"query":"hello","service_tier":"default"}`} {
		post(srv, body)
		in, _ := lastInput(tc)
		if in.ServiceTier != request.ClassDefault || in.Settings.Weight != srv.cfg.Limits.Tiers["free"].Weight {
			t.Errorf("%s: class %q weight %d, want default at the tier's weight", body, in.ServiceTier, in.Settings.Weight)
		}
	}
}

// A class the plan does not grant, or a value that is no class, is a
// 400 naming service_tier on both endpoints, and starts nothing.
func TestServiceTierRefusals(t *testing.T) {
	srv, tc, _ := newTestServer(t, classConfig)
	completion := func(tier string) string {
		return `{"model":"sluice-sim","messages":[{"role":"user","content":"hello"}],"service_tier":` + tier + `}`
	}
	assertOpenAIError(t, postCompletion(srv, completion(`"default"`), nil), 400, "invalid_request_error", "service_tier_not_allowed", "service_tier")
	assertOpenAIError(t, postCompletion(srv, completion(`"scale"`), nil), 400, "invalid_request_error", "invalid_service_tier", "service_tier")
	assertOpenAIError(t, postCompletion(srv, completion(`7`), nil), 400, "invalid_request_error", "bad_json", "")
	assertJSONError(t, post(srv, `{"query":"hello","service_tier":"default"}`), 400, "service_tier_not_allowed")
	assertJSONError(t, post(srv, `{"query":"hello","service_tier":"PRIORITY"}`), 400, "invalid_service_tier")
	if rec := post(srv, `{"query":"hello","service_tier":"default"}`); !strings.Contains(rec.Body.String(), "service_tier") {
		t.Errorf("the refusal does not name the field: %s", rec.Body)
	}
	if n := tc.starts.Load(); n != 0 {
		t.Fatalf("%d workflows started by refused classes", n)
	}
}

// The admin API shows a tier's classes and changes them at run time:
// the next request is served by the new grant, and a class that is no
// class is refused naming its field.
func TestAdminChangesTheClasses(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	rec := admin(srv, "GET", "/v1/admin/limits", "root", "")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"priority":{"weight":8,"ttft_slo":"1s","tpot_slo":"100ms"}`) {
		t.Fatalf("get limits %d %s: want vip's classes with readable SLOs", rec.Code, rec.Body)
	}
	var doc map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &doc)
	vip := doc["tiers"].(map[string]any)["vip"].(map[string]any)
	vip["classes"] = map[string]any{"priority": map[string]any{"weight": 7, "ttft_slo": "500ms"}, "default": map[string]any{"weight": 5}}
	body, _ := json.Marshal(doc)
	if rec := admin(srv, "PUT", "/v1/admin/limits", "root", string(body)); rec.Code != 200 {
		t.Fatalf("put limits %d %s", rec.Code, rec.Body)
	}
	assertJSONError(t, post(srv, `{"query":"hello","service_tier":"flex"}`), 400, "service_tier_not_allowed")
	post(srv, `{"query":"hello","service_tier":"priority"}`)
	if in, n := lastInput(tc); n != 1 || in.ServiceTier != request.ClassPriority || in.Settings.Weight != 7 || in.Settings.TTFTSLO != 500*time.Millisecond {
		t.Fatalf("after the change: %d starts, class %q settings %+v", n, in.ServiceTier, in.Settings)
	}

	vip["classes"] = map[string]any{"gold": map[string]any{"weight": 7}, "default": map[string]any{"weight": 5}}
	body, _ = json.Marshal(doc)
	rec = admin(srv, "PUT", "/v1/admin/limits", "root", string(body))
	assertJSONError(t, rec, 400, "invalid_policy")
	if !strings.Contains(rec.Body.String(), "limits.tiers.vip.classes.gold: unknown class") {
		t.Fatalf("refusal %s does not name the field", rec.Body)
	}
}
