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
	Templating struct {
		List []struct {
			Type    string `json:"type"`
			Name    string `json:"name"`
			Query   any    `json:"query"`
			Current struct {
				Value any `json:"value"`
			} `json:"current"`
			IncludeAll bool   `json:"includeAll"`
			AllValue   string `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
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
	uid := "${" + VarDatasource + "}"
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
			t.Errorf("panel %q: datasource %+v, want prometheus %s", p.Title, p.Datasource, uid)
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
	m := registry(t)
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

// registry is Sluice's metrics with every collector registered and every
// labelled family observed once.
func registry(t *testing.T) *metrics.Metrics {
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
	return m
}

func TestExprsCoverEveryPanel(t *testing.T) {
	n := 0
	for _, r := range Rows {
		for _, p := range r.Panels {
			n += len(p.Targets)
			if p.Axis == "" || p.Unit == "" {
				t.Errorf("panel %q: no unit or axis label", p.Title)
			}
		}
	}
	if got := len(Exprs()); got != n+len(Annotations) || slices.Contains(Exprs(), "") {
		t.Fatalf("Exprs has %d queries, want %d, none empty", got, n+len(Annotations))
	}
}

// The dashboard imports into any Grafana: its datasource is a variable of
// type prometheus whose default is the provisioned one, and namespace,
// job and pool are multi-value variables with an All of .* in that order
// (each query narrowed by the ones before).
func TestVariables(t *testing.T) {
	d := loadDashboard(t)
	var names []string
	for _, v := range d.Templating.List {
		names = append(names, v.Name)
		switch v.Name {
		case VarDatasource:
			if v.Type != "datasource" || v.Query != "prometheus" || v.Current.Value != provisionedUID(t) {
				t.Errorf("datasource variable %+v: want type datasource, query prometheus, default %s", v, provisionedUID(t))
			}
		default:
			q, _ := v.Query.(string)
			if v.Type != "query" || !v.IncludeAll || v.AllValue != ".*" || !strings.HasPrefix(q, "label_values(") {
				t.Errorf("variable %s %+v: want a label_values query with All = .*", v.Name, v)
			}
		}
	}
	if want := []string{VarDatasource, VarNamespace, VarJob, VarPool}; !slices.Equal(names, want) {
		t.Fatalf("variables %v, want %v", names, want)
	}
}

var matcher = regexp.MustCompile(`\b((?:sluice|temporal)_[a-z0-9_]+)\{([^}]*)\}`)

// Every series a query reads is scoped to $namespace and $job, and to
// $pool exactly when its family has a pool label (PoolLabelled, checked
// against the registry), so that two deployments in one Prometheus, or
// two pools, never add up in a panel.
func TestQueriesAreScoped(t *testing.T) {
	pooled := map[string]bool{}
	m := registry(t)
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, l := range f.GetMetric()[0].GetLabel() {
			if l.GetName() == "pool" {
				pooled[f.GetName()] = true
			}
		}
	}
	for name := range pooled {
		if !PoolLabelled[name] {
			t.Errorf("%s has a pool label but is not in PoolLabelled", name)
		}
	}
	for name := range PoolLabelled {
		if !pooled[name] {
			t.Errorf("PoolLabelled lists %s, which has no pool label", name)
		}
	}
	for _, expr := range Exprs() {
		if n, scoped := len(seriesName.FindAllString(expr, -1)), len(matcher.FindAllString(expr, -1)); n != scoped {
			t.Errorf("%d of %d selectors unscoped: %s", n-scoped, n, expr)
		}
		for _, sel := range matcher.FindAllStringSubmatch(expr, -1) {
			family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(sel[1], "_bucket"), "_count"), "_sum")
			has := func(label string) bool { return strings.Contains(sel[2], label+`=~"$`+label+`"`) }
			if !has(VarNamespace) || !has(VarJob) || has(VarPool) != PoolLabelled[family] {
				t.Errorf("selector %s: want namespace and job matchers, and pool iff %s has a pool label", sel[0], family)
			}
		}
	}
}
