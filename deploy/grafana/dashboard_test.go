package grafana

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/metrics"
)

// sluice.json is what dashboard.go generates: edit the Go, then
// go run ./cmd/sluice-dashboard json.
func TestJSONIsGenerated(t *testing.T) {
	want, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("sluice.json is not what dashboard.go generates: run go run ./cmd/sluice-dashboard json")
	}
}

type jsonDashboard struct {
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Panels        []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos struct {
			X, Y, W, H int
		} `json:"gridPos"`
		Datasource *struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr       string `json:"expr"`
			RefID      string `json:"refId"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
	Annotations struct {
		List []struct {
			Name       string `json:"name"`
			Expr       string `json:"expr"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"list"`
	} `json:"annotations"`
}

func loadDashboard(t *testing.T) jsonDashboard {
	t.Helper()
	raw, err := os.ReadFile("sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var d jsonDashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("parse sluice.json: %v", err)
	}
	return d
}

// provisionedUID is the datasource uid Grafana's provisioning creates.
func provisionedUID(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("provisioning/datasources/prometheus.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds struct {
		Datasources []struct {
			UID string `yaml:"uid"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(raw, &ds); err != nil || len(ds.Datasources) != 1 {
		t.Fatalf("provisioning/datasources/prometheus.yaml: want one datasource (%v)", err)
	}
	return ds.Datasources[0].UID
}

func TestDashboardStructure(t *testing.T) {
	d := loadDashboard(t)
	uid := provisionedUID(t)
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want a current one (36 or later)", d.SchemaVersion)
	}
	if d.UID == "" {
		t.Error("dashboard has no uid")
	}
	ids := map[int]string{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	for _, p := range d.Panels {
		if p.ID <= 0 {
			t.Errorf("panel %q has id %d", p.Title, p.ID)
		}
		if other, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.X < 0 || g.Y < 0 || g.W <= 0 || g.H <= 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v is out of the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap at (%d, %d)", other, p.Title, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != uid || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want prometheus %s (provisioned)", p.Title, p.Datasource, uid)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
				t.Errorf("panel %q: a target without expr or refId", p.Title)
			}
			if tg.Datasource.UID != uid {
				t.Errorf("panel %q: a target's datasource %q, want %s", p.Title, tg.Datasource.UID, uid)
			}
		}
	}
	if len(d.Annotations.List) == 0 {
		t.Error("no annotations: the healer's actions should mark the panels")
	}
	for _, a := range d.Annotations.List {
		if a.Expr == "" || a.Datasource.UID != uid {
			t.Errorf("annotation %q: expr %q, datasource %q", a.Name, a.Expr, a.Datasource.UID)
		}
	}
}

var seriesName = regexp.MustCompile(`\b(?:sluice|temporal)_[a-z0-9_]+\b`)

// Every series a query reads is one Sluice or the Temporal SDK exports:
// Sluice's from a registry with every collector registered and every
// labelled family observed once, the SDK's from metrics.TemporalSeries
// (which tests/integration checks a real worker exposes).
func TestQueriesReadExportedSeries(t *testing.T) {
	known := sluiceSeries(t)
	for _, s := range metrics.TemporalSeries {
		known[s] = true
		// A histogram's _bucket is listed; its _count and _sum come along.
		if base, ok := strings.CutSuffix(s, "_bucket"); ok {
			known[base+"_count"], known[base+"_sum"] = true, true
		}
	}
	for _, expr := range Exprs() {
		names := seriesName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("query reads no Sluice or Temporal series: %s", expr)
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("query reads %s, which nothing exports: %s", n, expr)
			}
		}
	}
}

// sluiceSeries gathers every series name Sluice's registry can expose.
func sluiceSeries(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New(nil)
	m.TrackTenants(1)
	m.TenantServed(metrics.TenantService{Tenant: "a", Pool: "short", Tier: "free", PromptTokens: 1})
	m.RegisterTierWeights(func() map[string]int { return map[string]int{"free": 2} })
	m.ObserveRequest(metrics.Request{Route: "short", Outcome: "done", Tier: "free", PromptTokens: 1, CompletionTokens: 1,
		Timings: []events.StageTiming{{Stage: "admission", Ms: 1}, {Stage: "llm_first_token", Ms: 1}}})
	m.RateLimit("tenant", false)
	m.BanImposed("ip")
	m.Banned("ip")
	m.HealingAlert("short", "warn")
	m.HealingAction("short", "set_permits")
	m.HealingLevel("short", 1, time.Minute)
	m.RegisterPools([]string{"short"}, func(context.Context, string) (metrics.PoolStats, error) {
		return metrics.PoolStats{Backlog: map[string]int{"a": 1}}, nil
	})
	m.RegisterCache("answer", func() metrics.CacheStats { return metrics.CacheStats{} })
	m.RegisterBackends(func() []metrics.Circuit { return []metrics.Circuit{{Pool: "short", Endpoint: "x"}} })
	m.RegisterDependency("redis", func(context.Context) error { return nil })
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		known[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				known[name+suffix] = true
			}
		}
	}
	for _, want := range []string{"sluice_requests_total", "sluice_ttft_seconds_bucket", "sluice_dependency_up", "sluice_tenant_backlog"} {
		if !known[want] {
			t.Fatalf("the registry lacks %s: sluiceSeries does not register everything", want)
		}
	}
	return known
}

func TestExprsCoverEveryPanel(t *testing.T) {
	n := 0
	for _, r := range Rows {
		for _, p := range r.Panels {
			n += len(p.Targets)
		}
	}
	if got := len(Exprs()); got != n+len(Annotations) || slices.Contains(Exprs(), "") {
		t.Fatalf("Exprs has %d queries, want %d, none empty", got, n+len(Annotations))
	}
}
