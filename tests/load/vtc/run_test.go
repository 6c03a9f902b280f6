package vtc

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// A run of the trace's first minute keeps the rows that arrive in it, a
// tenant per client on the fair tier, and the whole trace's simulator;
// the configuration it makes validates and admits every client's key.
func TestPrepareAndConfigureAShortRun(t *testing.T) {
	dir := filepath.Join("..", "..", "..", DefaultDir)
	w := Workloads["real"]
	if _, err := os.Stat(w.Path(dir)); err != nil {
		t.Skipf("no %s: %v", w.Path(dir), err)
	}
	writer, err := NewPromptWriter(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.Duration = 60
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	short, err := Prepare(w, dir, o, writer)
	if err != nil {
		t.Fatal(err)
	}
	all := DefaultOptions()
	if err := all.Validate(); err != nil {
		t.Fatal(err)
	}
	whole, err := Prepare(w, dir, all, writer)
	if err != nil {
		t.Fatal(err)
	}
	if short.Sizing != whole.Sizing || short.Spec.Span != 60 {
		t.Errorf("a short run's simulator %+v and span %v; want the whole trace's %+v and 60", short.Sizing, short.Spec.Span, whole.Sizing)
	}
	if len(short.Rows) == 0 || len(short.Rows) >= len(whole.Rows) || short.Rows[len(short.Rows)-1].Arrival >= 60 {
		t.Fatalf("%d rows of %d, the last at %v s", len(short.Rows), len(whole.Rows), short.Rows[len(short.Rows)-1].Arrival)
	}
	tenants := map[string]bool{}
	for _, c := range RowClients(short.Rows) {
		k, ok := short.Keys[c]
		if !ok || k.Tier != FairTier || tenants[k.Tenant] {
			t.Errorf("client %s: key %+v (a tenant of its own on %s wanted)", c, k, FairTier)
		}
		tenants[k.Tenant] = true
	}
	cfg := config.Default()
	cfg.Pools.Short.Endpoints, cfg.Pools.Long.Endpoints = []string{"http://127.0.0.1:1"}, []string{"http://127.0.0.1:1"}
	short.Configure(&cfg, o)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the configuration of a run: %v", err)
	}
	if cfg.Pools.SharedLimit() != o.Batch || cfg.Limits.Tiers[FairTier].Weight != cfg.Limits.Tiers["standard"].Weight {
		t.Errorf("shared permits %d (want %d), fair tier %+v", cfg.Pools.SharedLimit(), o.Batch, cfg.Limits.Tiers[FairTier])
	}
	keys := map[string]bool{}
	for _, k := range cfg.Auth.APIKeys {
		keys[k.Key] = true
	}
	for c, k := range short.Keys {
		if !keys[k.Key] {
			t.Errorf("client %s's key is not configured", c)
		}
	}
}
