package worker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// The admin API's form of the default configuration's policy (GET and
// PUT /v1/admin/limits), which operators' scripts read and write.
const defaultPolicyJSON = `{"version":7,"epoch":"abc","enabled":true,"default_tier":"standard","tiers":{` +
	`"free":{"weight":2,"max_queue_per_tenant":100,"max_concurrent":2,"max_output_tokens":512,` +
	`"tenant":{"tokens_per_minute":50000,"requests_per_minute":100},"user":{"tokens_per_minute":20000,"requests_per_minute":30},"ip":{"requests_per_minute":120},` +
	`"routes":{"reads":{"tenant_per_minute":300,"ip_per_minute":300},"resumes":{"tenant_per_minute":60,"ip_per_minute":60},"ingest":{"tenant_per_minute":20,"ip_per_minute":20}},` +
	`"ingest_quota":{"documents":1000,"bytes":20971520},"file_quota":{"bytes":104857600},"max_wait":"15s"},` +
	`"standard":{"weight":3,"max_queue_per_tenant":1000,"max_concurrent":0,"max_output_tokens":0,` +
	`"tenant":{"tokens_per_minute":200000,"requests_per_minute":300},"user":{"tokens_per_minute":60000,"requests_per_minute":120},"ip":{"requests_per_minute":600},` +
	`"routes":{"reads":{"tenant_per_minute":1200,"ip_per_minute":600},"resumes":{"tenant_per_minute":300,"ip_per_minute":300},"ingest":{"tenant_per_minute":120,"ip_per_minute":120}},` +
	`"ingest_quota":{"documents":100000,"bytes":2147483648},"file_quota":{"bytes":10737418240},"default_class":"default","classes":{"default":{"weight":3},"flex":{"weight":1}}},` +
	`"vip":{"weight":5,"max_queue_per_tenant":5000,"max_concurrent":0,"max_output_tokens":0,` +
	`"tenant":{"tokens_per_minute":1000000,"requests_per_minute":1000},"user":{},"ip":{},` +
	`"routes":{"reads":{"tenant_per_minute":6000},"resumes":{"tenant_per_minute":1200},"ingest":{"tenant_per_minute":600}},` +
	`"ingest_quota":{},"max_wait":"1m0s",` +
	`"classes":{"default":{"weight":5},"flex":{"weight":2},"priority":{"weight":8,"ttft_slo":"1s","tpot_slo":"100ms"}}}},` +
	`"pools":{"long":{"max_concurrency":12},"short":{"max_concurrency":16}},"long_cost_factor":2.5}`

func TestPolicyOfTheDefaults(t *testing.T) {
	p := config.Default().Policy()
	p.Version, p.Epoch, p.LongCostFactor = 7, "abc", 2.5
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != defaultPolicyJSON {
		t.Fatalf("json\n%s\nwant\n%s", raw, defaultPolicyJSON)
	}
	var back policy.Policy
	if err := json.Unmarshal(raw, &back); err != nil || !reflect.DeepEqual(back, p) {
		t.Fatalf("round trip %+v, %v", back, err)
	}
}

func TestPolicyIsValidatedAsTheConfigurationIs(t *testing.T) {
	cfg := config.Default()
	validate := cfg.PolicyDeployment().Check
	if err := validate(cfg.Policy()); err != nil {
		t.Fatalf("the default policy: %v", err)
	}
	cases := []struct {
		name   string
		change func(p *policy.Policy)
		want   string
	}{
		{"weight", func(p *policy.Policy) { p.Limits.Tiers = map[string]policy.Tier{"standard": {Weight: 0}} },
			"limits.tiers.standard.weight: must be > 0"},
		{"default tier", func(p *policy.Policy) { p.Limits.DefaultTier = "gold" }, `limits.default_tier: names unknown tier "gold"`},
		{"burst", func(p *policy.Policy) {
			p.Limits.Tiers["free"] = policy.Tier{Weight: 1, User: policy.Rate{TokenBurst: 5}}
		},
			"limits.tiers.free.user.token_burst: needs tokens_per_minute"},
		{"pool", func(p *policy.Policy) { p.Pools["short"] = 0 }, "pools.short.max_concurrency"},
		{"long cost factor", func(p *policy.Policy) { p.LongCostFactor = 11 },
			"invalid policy: long_cost_factor must be 0 (off) or between 1 and 10, got 11"},
		{"below a factor of 1", func(p *policy.Policy) { p.LongCostFactor = 0.5 },
			"invalid policy: long_cost_factor must be 0 (off) or between 1 and 10, got 0.5"},
	}
	for _, tc := range cases {
		p := cfg.Policy()
		tc.change(&p)
		if err := validate(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// The healer may shrink a pool below its configured floor.
	p := cfg.Policy()
	p.Pools["short"], p.LongCostFactor = 1, 2.5
	if err := validate(p); err != nil {
		t.Fatalf("a pool of 1: %v", err)
	}
}

type gateLimits map[string]int

func (g gateLimits) SetLimit(_ context.Context, pool string, n int) error {
	g[pool] = n
	return nil
}

// The store NewPolicy builds starts from the configuration's policy and
// refuses what the configuration would, by its YAML path.
func TestNewPolicyChecksWhatIsPut(t *testing.T) {
	cfg := config.Default()
	cfg.Redis.KeyPrefix = testenv.KeyPrefix(t)
	gate := gateLimits{}
	s := NewPolicy(srv.Client(t), cfg, gate, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !reflect.DeepEqual(*s.Current(), cfg.Policy()) {
		t.Fatalf("starts from %+v", s.Current())
	}
	ctx := context.Background()
	_, err := s.Update(ctx, func(p *policy.Policy) bool { p.Limits.DefaultTier = "gold"; return true })
	if err == nil || !strings.Contains(err.Error(), `limits.default_tier: names unknown tier "gold"`) {
		t.Fatalf("err %v", err)
	}
	out, err := s.Update(ctx, func(p *policy.Policy) bool { p.Pools["long"] = 2; return true })
	if err != nil || out.Version != 1 || gate["long"] != 2 {
		t.Fatalf("put %+v, %v, gate %v", out, err, gate)
	}
}
