package metrics

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// collected runs collect and returns each metric's value by its labels
// ("kind=prompt,pool=short,tenant=a,tier=free", names in order).
func collected(t *testing.T, collect func(chan<- prometheus.Metric)) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric)
	go func() {
		collect(ch)
		close(ch)
	}()
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		var labels []string
		for _, l := range d.GetLabel() {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
		key := strings.Join(labels, ",")
		if _, dup := out[key]; dup {
			t.Fatalf("two series %s", key)
		}
		out[key] = d.GetCounter().GetValue() + d.GetGauge().GetValue()
	}
	return out
}

func tokens(tenant, pool, tier, kind string) string {
	return "kind=" + kind + ",pool=" + pool + ",tenant=" + tenant + ",tier=" + tier
}

func backlogOf(tenant, pool string) string { return "pool=" + pool + ",tenant=" + tenant }

// tenantLabels are the distinct tenant labels of a collection.
func tenantLabels(got map[string]float64) map[string]bool {
	out := map[string]bool{}
	for key := range got {
		for l := range strings.SplitSeq(key, ",") {
			if v, ok := strings.CutPrefix(l, "tenant="); ok {
				out[v] = true
			}
		}
	}
	return out
}

// fakeClock steps the tenants' clock by hand.
type fakeClock struct{ at time.Time }

func (c *fakeClock) now() time.Time      { return c.at }
func (c *fakeClock) add(d time.Duration) { c.at = c.at.Add(d) }
func newTracked(max int) (*tenants, *fakeClock) {
	clock := &fakeClock{at: time.Unix(1_700_000_000, 0)}
	tn := newTenants(max)
	tn.now = clock.now
	return tn, clock
}

func TestTenantServiceIsCountedByPoolTierAndKind(t *testing.T) {
	m := New(nil)
	m.TrackTenants(10)
	m.TenantServed(TenantService{Tenant: "acme", Pool: "short", Tier: "vip", PromptTokens: 300, CompletionTokens: 50})
	m.TenantServed(TenantService{Tenant: "acme", Pool: "short", Tier: "vip", PromptTokens: 200, CompletionTokens: 25})
	m.TenantServed(TenantService{Tenant: "acme", Pool: "long", Tier: "vip", PromptTokens: 4000})
	m.TenantServed(TenantService{Tenant: "initech", Pool: "short", Tier: "free", PromptTokens: 10, CompletionTokens: 90})
	// A request without a tenant, or of a tenant named like the bucket,
	// is the bucket's.
	m.TenantServed(TenantService{Pool: "short", Tier: "free", PromptTokens: 1, CompletionTokens: 2})
	m.TenantServed(TenantService{Tenant: OtherTenants, Pool: "short", Tier: "free", PromptTokens: 1, CompletionTokens: 2})
	got := collected(t, m.tenants.Collect)
	want := map[string]float64{
		tokens("acme", "short", "vip", "prompt"): 500, tokens("acme", "short", "vip", "completion"): 75,
		// Both kinds exist from the first request, a zero one too.
		tokens("acme", "long", "vip", "prompt"): 4000, tokens("acme", "long", "vip", "completion"): 0,
		tokens("initech", "short", "free", "prompt"): 10, tokens("initech", "short", "free", "completion"): 90,
		tokens(OtherTenants, "short", "free", "prompt"): 2, tokens(OtherTenants, "short", "free", "completion"): 4,
	}
	if len(got) != len(want) {
		t.Fatalf("series %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if !strings.Contains(scrape(t, m), `sluice_tenant_llm_tokens_total{kind="prompt",pool="short",tenant="acme",tier="vip"} 500`) {
		t.Error("the registry does not serve the tenants' counters")
	}
}

// With the per-tenant series off (metrics.tenant_series: 0) nothing is
// counted or exposed per tenant.
func TestTenantSeriesOff(t *testing.T) {
	m := New(nil)
	m.TrackTenants(0)
	m.TenantServed(TenantService{Tenant: "acme", Pool: "short", PromptTokens: 1})
	m.RegisterPools([]string{"short"}, func(context.Context, string) (PoolStats, error) {
		return PoolStats{Waiting: 1, Backlog: map[string]int{"acme": 1}}, nil
	})
	if out := scrape(t, m); strings.Contains(out, "sluice_tenant_") {
		t.Fatalf("per-tenant series while off:\n%s", grep(out, "sluice_tenant_"))
	}
}

// At most max tenants have series of their own; the rest are counted
// under OtherTenants, and a place is only given up by a tenant idle for
// tenantIdle, whose series then vanish while no other series goes down.
func TestTenantSeriesAreBounded(t *testing.T) {
	tn, clock := newTracked(2)
	serve := func(tenant string, n int) {
		tn.serve(TenantService{Tenant: tenant, Pool: "short", Tier: "free", PromptTokens: n})
		clock.add(time.Second)
	}
	serve("a", 1)
	serve("b", 10)
	serve("c", 100) // no room: counted as other
	serve("d", 1000)
	got := collected(t, tn.Collect)
	if labels := tenantLabels(got); len(labels) != 3 || !labels["a"] || !labels["b"] || !labels[OtherTenants] {
		t.Fatalf("tenant labels %v, want a, b and %s", labels, OtherTenants)
	}
	if v := got[tokens(OtherTenants, "short", "free", "prompt")]; v != 1100 {
		t.Fatalf("other's prompt tokens %v, want c's and d's 1100", v)
	}
	// b stays busy; a goes idle. Just short of tenantIdle, c still finds
	// no room; past it, c takes a's place.
	clock.add(tenantIdle - 10*time.Second)
	serve("b", 10)
	serve("c", 100)
	if labels := tenantLabels(collected(t, tn.Collect)); labels["c"] {
		t.Fatalf("c took a place from a tenant idle less than %s: %v", tenantIdle, labels)
	}
	clock.add(5 * time.Second)
	serve("c", 100)
	got = collected(t, tn.Collect)
	if labels := tenantLabels(got); len(labels) != 3 || !labels["b"] || !labels["c"] || labels["a"] {
		t.Fatalf("tenant labels %v, want b, c and %s: a, idle longest, gives up its place", labels, OtherTenants)
	}
	if got[tokens("c", "short", "free", "prompt")] != 100 || got[tokens("b", "short", "free", "prompt")] != 20 {
		t.Fatalf("c and b: %v; want c counted from its own first request (100), b's 20 kept", got)
	}
	if v := got[tokens(OtherTenants, "short", "free", "prompt")]; v != 1200 {
		t.Fatalf("other's prompt tokens %v, want 1200: never lower than before", v)
	}
}

// Tenants with a backlog come first: the largest take free places, one
// takes the place of a tenant without a backlog at once, and every
// tenant with its own series reports its backlog in every pool read, 0
// when it has none, the rest summed under OtherTenants.
func TestBackloggedTenantsComeFirst(t *testing.T) {
	tn, clock := newTracked(3)
	tn.serve(TenantService{Tenant: "idle", Pool: "short", Tier: "free", PromptTokens: 1})
	clock.add(time.Second)
	tn.serve(TenantService{Tenant: "busy", Pool: "short", Tier: "free", PromptTokens: 1})
	clock.add(time.Second)
	// One free place, three tenants waiting: the deepest backlog gets
	// it, the next takes idle's (least recently active) place at once,
	// and busy's goes too, as busy has no backlog.
	got := collected(t, func(ch chan<- prometheus.Metric) {
		tn.backlog(map[string]map[string]int{
			"short": {"x": 9, "y": 2},
			"long":  {"y": 5, "z": 1},
		}, ch)
	})
	want := map[string]float64{
		// y: 7 in all, x: 9, z: 1; all three get places.
		backlogOf("x", "short"): 9, backlogOf("y", "short"): 2, backlogOf("z", "short"): 0, backlogOf(OtherTenants, "short"): 0,
		backlogOf("x", "long"): 0, backlogOf("y", "long"): 5, backlogOf("z", "long"): 1, backlogOf(OtherTenants, "long"): 0,
	}
	if len(got) != len(want) {
		t.Fatalf("backlog series %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	// Every place is held by a backlogged tenant: a newcomer with a
	// backlog is other's, and so is one being served.
	got = collected(t, func(ch chan<- prometheus.Metric) {
		tn.backlog(map[string]map[string]int{"short": {"x": 1, "y": 1, "z": 1, "w": 4}}, ch)
	})
	if got[backlogOf(OtherTenants, "short")] != 4 || got[backlogOf("x", "short")] != 1 || len(got) != 4 {
		t.Fatalf("backlog series %v, want x, y, z with 1 and w's 4 as %s", got, OtherTenants)
	}
	tn.serve(TenantService{Tenant: "busy", Pool: "short", Tier: "free", PromptTokens: 1})
	if labels := tenantLabels(collected(t, tn.Collect)); labels["busy"] || labels["w"] || len(labels) != 1 {
		t.Fatalf("token series of %v, want only %s (x, y, z were never served)", labels, OtherTenants)
	}
	// z's backlog ends: w takes its place at the next read.
	got = collected(t, func(ch chan<- prometheus.Metric) {
		tn.backlog(map[string]map[string]int{"short": {"x": 1, "y": 1, "w": 4}}, ch)
	})
	if got[backlogOf("w", "short")] != 4 || got[backlogOf(OtherTenants, "short")] != 0 || len(got) != 4 {
		t.Fatalf("backlog series %v, want w's own, z gone", got)
	}
}

// The pools' collector hands each pool's backlog to the tenants in the
// same read as the pool gauges, and describes what it sends.
func TestPoolsReportTenantBacklogs(t *testing.T) {
	m := New(nil)
	m.TrackTenants(5)
	m.RegisterPools([]string{"short"}, func(context.Context, string) (PoolStats, error) {
		return PoolStats{Waiting: 3, Backlog: map[string]int{"acme": 2, "initech": 1}}, nil
	})
	out := scrape(t, m)
	for _, want := range []string{
		`sluice_pool_queue_depth{pool="short"} 3`,
		`sluice_tenant_backlog{pool="short",tenant="acme"} 2`,
		`sluice_tenant_backlog{pool="short",tenant="initech"} 1`,
		`sluice_tenant_backlog{pool="short",tenant="_other"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %s in\n%s", want, grep(out, "sluice_tenant_backlog"))
		}
	}
}

// The public port's handler leaves out every series that names a tenant;
// the tier weights and the pools' gauges stay.
func TestPublicHandlerHidesTenants(t *testing.T) {
	m := New(nil)
	m.TrackTenants(5)
	m.TenantServed(TenantService{Tenant: "acme", Pool: "short", Tier: "vip", PromptTokens: 1})
	m.RegisterPools([]string{"short"}, func(context.Context, string) (PoolStats, error) {
		return PoolStats{Waiting: 1, Backlog: map[string]int{"acme": 1}}, nil
	})
	m.RegisterTierWeights(func() map[string]int { return map[string]int{"vip": 5, "free": 2} })
	srv := httptest.NewServer(m.PublicHandler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	public := string(b)
	if strings.Contains(public, "acme") || strings.Contains(public, "sluice_tenant_") {
		t.Fatalf("the public scrape names a tenant:\n%s", grep(public, "acme"))
	}
	for _, want := range []string{`sluice_pool_queue_depth{pool="short"} 1`, `sluice_tier_weight{tier="vip"} 5`, `sluice_tier_weight{tier="free"} 2`} {
		if !strings.Contains(public, want) {
			t.Errorf("public scrape lacks %s", want)
		}
	}
	private := scrape(t, m)
	for family := range tenantFamilies {
		if !strings.Contains(private, family+"{") {
			t.Errorf("the metrics port lacks %s", family)
		}
	}
}

// Requests counted while scrapes read: no race, and with nobody
// displaced, nothing lost.
func TestTenantServiceConcurrently(t *testing.T) {
	m := New(nil)
	m.TrackTenants(3)
	// No backlog: a backlogged tenant would take a place at once, and the
	// series of the tenant it displaced would vanish.
	m.RegisterPools([]string{"short"}, func(context.Context, string) (PoolStats, error) { return PoolStats{}, nil })
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			for range 200 {
				m.TenantServed(TenantService{Tenant: "t" + string(rune('0'+i)), Pool: "short", Tier: "free", PromptTokens: 1, CompletionTokens: 1})
			}
		})
	}
	for range 5 {
		scrape(t, m)
	}
	wg.Wait()
	total := 0.0
	got := collected(t, m.tenants.Collect)
	for _, v := range got {
		total += v
	}
	if total != 6*200*2 {
		t.Fatalf("%v tokens counted, want %d", total, 6*200*2)
	}
	if labels := tenantLabels(got); len(labels) > 4 {
		t.Fatalf("tenant labels %v: more than 3 and %s", labels, OtherTenants)
	}
}
