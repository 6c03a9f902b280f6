package cluster

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/pkg/policy"
)

type limits map[string]int

func (l limits) SetLimit(_ context.Context, pool string, n int) error {
	l[pool] = n
	return nil
}

// The live policy's version transaction (counter and epoch together).
func TestPolicy(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	base := policy.Policy{Pools: map[string]int{"short": 16, "long": 4}}
	gate := limits{}
	s := policy.NewStore(rdb, policy.Options{KeyPrefix: prefix, Base: base, Gate: gate, Logger: logger(t)})
	out, err := s.Update(ctx, func(p *policy.Policy) bool { p.Pools["short"] = 3; return true })
	ok(t, "put", err)
	if out.Version != 1 || gate["short"] != 3 {
		t.Fatalf("put: version %d, gate %v", out.Version, gate)
	}
	other := policy.NewStore(rdb, policy.Options{KeyPrefix: prefix, Base: base, Gate: limits{}, Logger: logger(t)})
	ok(t, "refresh", other.Refresh(ctx))
	if other.Current().Version != 1 {
		t.Fatalf("another instance has version %d", other.Current().Version)
	}
}
