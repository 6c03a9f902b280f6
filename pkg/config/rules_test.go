package config

import (
	"slices"
	"testing"

	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

// The rules config holds as plain data must stay those of the packages
// that own them, or a value config accepts would fail at start-up (or one
// it refuses would work).

func TestPoolNamesAreTheRoutes(t *testing.T) {
	names := Default().Pools.ByName()
	if len(names) != len(request.Pools()) {
		t.Fatalf("pools %v, routes %v", names, request.Pools())
	}
	for _, p := range request.Pools() {
		if _, ok := names[p]; !ok {
			t.Errorf("no pool named %q", p)
		}
	}
}

func TestKeyRulesAreKeys(t *testing.T) {
	var all []string
	for _, s := range keys.AllScopes {
		all = append(all, string(s))
	}
	if !slices.Equal(keyScopes, all) {
		t.Errorf("scopes %v, pkg/keys %v", keyScopes, all)
	}
	for _, names := range [][]string{nil, {"chat"}, {" admin ", "ingest"}, {"root"}, {"chat", "chat "}, {"chat", "Chat"}} {
		_, want := keys.ParseScopes(names)
		got := checkScopes(names)
		if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
			t.Errorf("scopes %q: config says %v, pkg/keys %v", names, got, want)
		}
	}
	for _, k := range []string{"", "sk-test", "ünïcode"} {
		if keyHash(k) != keys.Hash(k) {
			t.Errorf("hash of %q: config %s, pkg/keys %s", k, keyHash(k), keys.Hash(k))
		}
	}
}

func TestKBRulesAreKBRef(t *testing.T) {
	if kbNameRule != kbref.NameRule {
		t.Errorf("name rule %q, pkg/kbref %q", kbNameRule, kbref.NameRule)
	}
	long := string(make([]byte, 65))
	for _, key := range []string{"", "docs", "my docs", "d.e_f-1", "ü", long, "acme/docs", "/docs", "acme/", "a/b/c", "acme/bad name", "x:y{z}/d"} {
		tenant, name, ok := parseKBKey(key)
		ref, err := kbref.ParseKey(key)
		if ok != (err == nil) || (ok && (ref != kbref.Ref{Tenant: tenant, Name: name})) {
			t.Errorf("key %q: config (%q, %q, %v), pkg/kbref (%+v, %v)", key, tenant, name, ok, ref, err)
		}
		if kbName.MatchString(key) != kbref.ValidName(key) {
			t.Errorf("name %q: config %v, pkg/kbref %v", key, kbName.MatchString(key), kbref.ValidName(key))
		}
	}
	for _, kb := range []KnowledgeBase{{Name: "docs", Shared: true}, {Name: "docs", Tenant: "acme"}} {
		if want := (kbref.Ref{Tenant: kb.Tenant, Name: kb.Name}).Key(); kb.key() != want {
			t.Errorf("%+v: key %q, pkg/kbref %q", kb, kb.key(), want)
		}
	}
}

func TestUnsupportedChoicesAreOpenAIs(t *testing.T) {
	if paramN != openai.ParamN || !slices.Equal(forwardedParams, openai.SamplingParams) || !slices.Equal(contentPartTypes, openai.ContentPartTypes) {
		t.Errorf("config: n=%q %v %v; pkg/openai: n=%q %v %v", paramN, forwardedParams, contentPartTypes,
			openai.ParamN, openai.SamplingParams, openai.ContentPartTypes)
	}
}

func TestHealingStagesAreTimedSeries(t *testing.T) {
	if !slices.Equal(healingStages, request.TimedSeries()) || stageLLMFirstToken != request.StageLLMFirstToken {
		t.Errorf("config %v (default %s), pkg/request %v (%s)", healingStages, stageLLMFirstToken, request.TimedSeries(), request.StageLLMFirstToken)
	}
}

func TestPoolDefaultsAreTheLLMClients(t *testing.T) {
	p, d, b := Default().Pools.Short, llm.DefaultDeadlines(), llm.DefaultBreaker()
	if (llm.Deadlines{Connect: p.ConnectTimeout, FirstToken: p.FirstTokenTimeout, TokenIdle: p.TokenIdleTimeout}) != d {
		t.Errorf("pool deadlines %s %s %s, pkg/llm %+v", p.ConnectTimeout, p.FirstTokenTimeout, p.TokenIdleTimeout, d)
	}
	if (llm.Breaker{Failures: p.Breaker.Failures, OpenFor: p.Breaker.OpenFor, SlowFirstToken: p.Breaker.SlowFirstToken}) != b {
		t.Errorf("pool breaker %+v, pkg/llm %+v", p.Breaker, b)
	}
}
