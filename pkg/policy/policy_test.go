package policy

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
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

func newStore(t *testing.T, gate *fakeGate) *Store {
	cfg := config.Default()
	cfg.Redis.KeyPrefix = testenv.KeyPrefix(t)
	return NewStore(srv.Client(t), cfg, gate, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func TestPutReachesOtherInstances(t *testing.T) {
	gate := &fakeGate{limits: map[string]int{}}
	a, b := newStore(t, gate), newStore(t, &fakeGate{limits: map[string]int{}})
	ctx := context.Background()
	if a.Current().Version != 0 || a.Current().Pools["short"] != 16 {
		t.Fatalf("initial policy %+v", a.Current())
	}
	p := *a.Current()
	p.Limits.Tiers = map[string]config.Tier{}
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

func TestInvalidPolicyIsRefusedByName(t *testing.T) {
	s := newStore(t, &fakeGate{limits: map[string]int{}})
	p := *s.Current()
	p.Limits.Tiers = map[string]config.Tier{"standard": {Weight: 0}}
	_, err := s.Put(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "limits.tiers.standard.weight: must be > 0") {
		t.Fatalf("err %v", err)
	}
	p = *s.Current()
	p.Pools = map[string]int{"short": 1}
	if _, err := s.Put(context.Background(), p); err == nil {
		t.Fatal("a policy without the long pool was accepted")
	}
	if s.Current().Version != 0 {
		t.Fatal("a refused policy was adopted")
	}
}

func TestJSONUsesReadableDurations(t *testing.T) {
	p := FromConfig(config.Default())
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
	if back.Limits.Tiers["free"] != p.Limits.Tiers["free"] || back.Pools["long"] != p.Pools["long"] {
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

func TestLongCostFactorIsValidatedAndShared(t *testing.T) {
	gate := &fakeGate{limits: map[string]int{}}
	a, b := newStore(t, gate), newStore(t, &fakeGate{limits: map[string]int{}})
	ctx := context.Background()
	if f := a.Current().ChargeFactor("long"); f != 1 {
		t.Fatalf("configured policy charges long requests %v times", f)
	}
	for _, bad := range []float64{0.5, 11, -1} {
		p := *a.Current()
		p.LongCostFactor = bad
		_, err := a.Put(ctx, p)
		if err == nil || !strings.Contains(err.Error(), "invalid policy: long_cost_factor must be 0 (off) or between 1 and 10") {
			t.Fatalf("factor %v: %v", bad, err)
		}
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
// back to the configuration's policy when the shared one is gone, and take
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
		t.Fatalf("after the policy vanished b has %+v (%v); want the configuration's", b.Current(), err)
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
