package policy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

type fakeGate struct {
	mu     sync.Mutex
	limits map[string]int
}

func (g *fakeGate) SetLimit(_ context.Context, pool string, n int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limits[pool] = n
	return nil
}

// base is a policy as a configuration file might describe it.
func base() Policy {
	return Policy{
		Limits: Limits{Enabled: true, DefaultTier: "standard", Tiers: map[string]Tier{
			"free": {Weight: 2, MaxWait: 15 * time.Second, MaxQueuePerTenant: 100, Tenant: Rate{TokensPerMinute: 50000},
				Routes: RouteLimits{Reads: RouteRate{TenantPerMinute: 300}}, IngestQuota: IngestQuota{Documents: 1000}},
			"standard": {Weight: 3, MaxQueuePerTenant: 1000},
		}},
		Pools: map[string]int{"short": 16, "long": 4},
	}
}

// errZeroWeight is what the test stores' Validate refuses.
var errZeroWeight = errors.New("a tier's weight must be > 0")

func newStore(t *testing.T, gate *fakeGate) *Store {
	validate := func(p Policy) error {
		for _, tier := range p.Limits.Tiers {
			if tier.Weight <= 0 {
				return errZeroWeight
			}
		}
		return nil
	}
	return NewStore(srv.Client(t), Options{KeyPrefix: testenv.KeyPrefix(t), Base: base(), Gate: gate, Validate: validate,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func TestPutReachesOtherInstances(t *testing.T) {
	gate := &fakeGate{limits: map[string]int{}}
	a, b := newStore(t, gate), newStore(t, &fakeGate{limits: map[string]int{}})
	ctx := context.Background()
	if a.Current().Version != 0 || a.Current().Pools["short"] != 16 {
		t.Fatalf("initial policy %+v", a.Current())
	}
	p := *a.Current()
	p.Limits.Tiers = map[string]Tier{}
	for k, v := range a.Current().Limits.Tiers {
		p.Limits.Tiers[k] = v
	}
	free := p.Limits.Tiers["free"]
	free.Weight, free.MaxWait = 1, 5*time.Second
	p.Limits.Tiers["free"] = free
	p.Pools = map[string]int{"short": 4, "long": 2}
	out, err := a.Put(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if out.Version != 1 || gate.limits["short"] != 4 || gate.limits["long"] != 2 {
		t.Fatalf("put: %+v, gate %v", out, gate.limits)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	got := b.Current()
	if got.Version != 1 || got.Limits.Tiers["free"].Weight != 1 || got.Limits.Tiers["free"].MaxWait != 5*time.Second || got.Pools["short"] != 4 {
		t.Fatalf("other instance sees %+v", got)
	}
	// Refreshing again changes nothing; an older version never replaces a newer.
	if err := b.Refresh(ctx); err != nil || b.Current() != got {
		t.Fatal("refresh without a change replaced the policy")
	}
}

func TestInvalidPolicyIsRefused(t *testing.T) {
	gate := &fakeGate{limits: map[string]int{}}
	s := newStore(t, gate)
	p := *s.Current()
	p.Limits.Tiers = map[string]Tier{"standard": {Weight: 0}}
	if _, err := s.Put(context.Background(), p); !errors.Is(err, errZeroWeight) {
		t.Fatalf("err %v, want Validate's", err)
	}
	for _, pools := range []map[string]int{{"short": 1}, {"short": 1, "long": 1, "huge": 1}, {"short": 1, "lng": 1}} {
		p = *s.Current()
		p.Pools = pools
		_, err := s.Put(context.Background(), p)
		if err == nil || err.Error() != "invalid policy: pools must name exactly short and long" {
			t.Fatalf("pools %v: %v", pools, err)
		}
	}
	if s.Current().Version != 0 || len(gate.limits) != 0 {
		t.Fatalf("a refused policy was adopted: %+v, gate %v", s.Current(), gate.limits)
	}
}

func TestJSONUsesReadableDurations(t *testing.T) {
	p := base()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"max_wait":"15s"`) || !strings.Contains(string(raw), `"max_concurrency":16`) {
		t.Fatalf("json %s", raw)
	}
	var back Policy
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, p) {
		t.Fatalf("round trip %+v", back)
	}
	if err := json.Unmarshal([]byte(`{"tiers":{"x":{"max_wait":"soon"}}}`), &back); err == nil || !strings.Contains(err.Error(), "tiers.x.max_wait") {
		t.Fatalf("bad duration: %v", err)
	}
}

func TestRunPicksUpChangesWithinAnInterval(t *testing.T) {
	a, b := newStore(t, &fakeGate{limits: map[string]int{}}), newStore(t, &fakeGate{limits: map[string]int{}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.Run(ctx, 50*time.Millisecond)
	p := *a.Current()
	p.Pools = map[string]int{"short": 3, "long": 3}
	if _, err := a.Put(ctx, p); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.Current().Version != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the change did not arrive")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLongCostFactorIsShared(t *testing.T) {
	gate := &fakeGate{limits: map[string]int{}}
	a, b := newStore(t, gate), newStore(t, &fakeGate{limits: map[string]int{}})
	ctx := context.Background()
	if f := a.Current().ChargeFactor("long"); f != 1 {
		t.Fatalf("configured policy charges long requests %v times", f)
	}
	out, err := a.Update(ctx, func(p *Policy) bool { p.LongCostFactor = 2.5; return true })
	if err != nil {
		t.Fatal(err)
	}
	if out.Version != 1 || a.Current().ChargeFactor("long") != 2.5 || a.Current().ChargeFactor("short") != 1 {
		t.Fatalf("after update %+v", out)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Current().LongCostFactor != 2.5 || b.Current().Pools["short"] != 16 {
		t.Fatalf("other instance sees %+v", b.Current())
	}
	// b starts from the newest policy: its change keeps a's factor.
	if _, err := b.Update(ctx, func(p *Policy) bool { p.Pools["short"] = 8; return true }); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.Current(); got.Version != 2 || got.Pools["short"] != 8 || got.LongCostFactor != 2.5 {
		t.Fatalf("after b's update a sees %+v", got)
	}
	// A change that changes nothing writes nothing.
	if out, err := a.Update(ctx, func(*Policy) bool { return false }); err != nil || out.Version != 2 {
		t.Fatalf("no-op update %+v, %v", out, err)
	}
	raw, _ := json.Marshal(a.Current())
	if !strings.Contains(string(raw), `"long_cost_factor":2.5`) {
		t.Fatalf("json %s", raw)
	}
}

// A Redis that restarted empty counts versions from 1 again: instances go
// back to the base policy when the shared one is gone, and take
// the next policy put there although its version is lower than theirs.
func TestRestartedRedisIsNotIgnored(t *testing.T) {
	a, b := newStore(t, &fakeGate{limits: map[string]int{}}), newStore(t, &fakeGate{limits: map[string]int{}})
	ctx := context.Background()
	shrink := func(s *Store, n int) Policy {
		t.Helper()
		out, err := s.Update(ctx, func(p *Policy) bool { p.Pools["short"] = n; return true })
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for range 3 {
		shrink(a, 8)
	}
	if err := b.Refresh(ctx); err != nil || b.Current().Version != 3 {
		t.Fatalf("b at %d (%v), want 3", b.Current().Version, err)
	}
	rdb := srv.Client(t)
	keys, err := rdb.Keys(ctx, a.key+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("policy keys %v %v", keys, err)
	}
	if err := rdb.Del(ctx, keys...).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil || b.Current().Version != 0 || b.Current().Pools["short"] != 16 {
		t.Fatalf("after the policy vanished b has %+v (%v); want the base", b.Current(), err)
	}
	out := shrink(a, 4)
	if out.Version != 1 {
		t.Fatalf("first policy after the restart has version %d, want 1", out.Version)
	}
	if a.Current().Pools["short"] != 4 {
		t.Fatalf("a ignored its own new policy: %+v", a.Current())
	}
	if err := b.Refresh(ctx); err != nil || b.Current().Pools["short"] != 4 {
		t.Fatalf("b ignored the new policy: %+v (%v)", b.Current(), err)
	}
}
