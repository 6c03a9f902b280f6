// Package grafana defines Sluice's Grafana dashboard: its rows, panels and
// queries are declared here once, sluice.json is generated from them with
// Grafana's foundation SDK (go run ./cmd/sluice-dashboard
// json), and the preview tool draws the same queries from a real
// Prometheus.
//
// It builds the classic dashboard JSON, which Grafana's file provisioning
// loads, rather than the SDK's newer dashboardv2 resource, which only
// Grafana 12's v2 dashboard API takes.
//
// The dashboard imports into any Grafana: its Prometheus is the
// $datasource variable, and every query is scoped (Scope) to the
// $namespace and $job variables, and to $pool where the series has a
// pool, so that two deployments scraped by one Prometheus are told apart.
//
//lint:file-ignore SA1019 the classic dashboard builder is the one file provisioning loads everywhere
package grafana

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// DatasourceUID is the Prometheus datasource's uid, the one that
// provisioning/datasources/prometheus.yaml provisions: the $datasource
// variable's default, which any Prometheus datasource can replace.
const DatasourceUID = "sluice-prometheus"

// The dashboard's variables, each a regex matcher in every query ("All"
// is .*, which also matches a series without the label: a Prometheus
// outside Kubernetes has no namespace label).
const (
	VarDatasource = "datasource"
	VarNamespace  = "namespace"
	VarJob        = "job"
	VarPool       = "pool"
)

// PoolLabelled are the metric families of Sluice with a pool label, which
// Scope filters by $pool; a test checks the list against the registry.
var PoolLabelled = map[string]bool{
	"sluice_stage_duration_seconds": true, "sluice_healing_level": true, "sluice_admission_wait_seconds": true,
	"sluice_ttft_seconds": true, "sluice_llm_tokens_total": true, "sluice_healing_actions_total": true,
	"sluice_healing_alerts_total": true, "sluice_pool_permits_in_use": true, "sluice_pool_permits_limit": true,
	"sluice_pool_queue_depth": true, "sluice_pool_queue_oldest_wait_seconds": true, "sluice_backend_circuit_state": true,
	"sluice_permit_held_seconds_total": true, "sluice_permit_decoding_seconds_total": true, "sluice_admission_streamed_tokens_total": true,
	"sluice_admission_pauses_total":  true,
	"sluice_tenant_llm_tokens_total": true, "sluice_tenant_backlog": true,
}

// selector is a series name with its label matchers, if any.
var selector = regexp.MustCompile(`\b((?:sluice|temporal)_[a-z0-9_]+)(\{[^}]*\})?`)

// Scope adds the dashboard's variables to every series selector of expr:
// $namespace and $job always, $pool for a PoolLabelled family.
func Scope(expr string) string {
	return selector.ReplaceAllStringFunc(expr, func(sel string) string {
		m := selector.FindStringSubmatch(sel)
		name, own := m[1], strings.TrimSuffix(strings.TrimPrefix(m[2], "{"), "}")
		matchers := []string{}
		if own != "" {
			matchers = append(matchers, own)
		}
		matchers = append(matchers, VarNamespace+`=~"$`+VarNamespace+`"`, VarJob+`=~"$`+VarJob+`"`)
		family := name
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			family = strings.TrimSuffix(family, suffix)
		}
		if PoolLabelled[family] {
			matchers = append(matchers, VarPool+`=~"$`+VarPool+`"`)
		}
		return name + "{" + strings.Join(matchers, ", ") + "}"
	})
}

// UID is the dashboard's uid (its URL: /d/sluice).
const UID = "sluice"

// Target is one query of a panel.
type Target struct {
	Expr   string
	Legend string
}

// Panel is one time series panel.
type Panel struct {
	Title       string
	Description string
	// Unit is a Grafana unit id (s, reqps, percentunit, short).
	Unit string
	// Axis is the y axis's label, what is counted and in what unit: the
	// unit id alone does not say it (short is a count of anything).
	Axis    string
	Targets []Target
	// Width is in grid columns out of 24 (8: three a row).
	Width int
	// Thresholds draws dashed lines at these values (the alert rules'
	// thresholds).
	Thresholds []float64
}

// Row is a titled group of panels.
type Row struct {
	Title  string
	Panels []Panel
}

// Annotation marks events on every panel from a query: each step where
// it has a value is one mark.
type Annotation struct {
	Name, Expr, Title, Color string
}

// rateWindow is the window rate() and friends use, and rate its range
// selector; Grafana widens $__rate_interval to at least four scrape
// intervals.
const (
	rateWindow = "$__rate_interval"
	rate       = "[" + rateWindow + "]"
)

func quantile(q, by, metric, selector string) string {
	return fmt.Sprintf("histogram_quantile(%s, sum by (%sle) (rate(%s_bucket%s%s)))", q, by, metric, selector, rate)
}

// tailRatio is P99/P50 of the LLM's time to first token per pool: the
// healer's signal, and the alert rules' (deploy/prometheus).
var tailRatio = quantile("0.99", "pool, ", "sluice_stage_duration_seconds", `{stage="llm_first_token"}`) +
	" / " + quantile("0.5", "pool, ", "sluice_stage_duration_seconds", `{stage="llm_first_token"}`)

// TenantService is each tenant's service in each pool over window: the
// tokens it was served per second, prompt and completion alike, divided by
// its tier's weight, the admission queue's own measure (a request is
// charged its tokens and tenants share by weight). The "_other" bucket is
// many tenants, not one, and is left out. The recording rule
// tenant_pool:sluice_tenant_service:rate5m is this over 5m.
func TenantService(window string) string {
	return `sum by (namespace, job, tenant, pool) (sum by (namespace, job, tenant, pool, tier) (rate(sluice_tenant_llm_tokens_total{tenant!="_other"}[` + window +
		`])) / on (namespace, job, tier) group_left () max by (namespace, job, tier) (sluice_tier_weight))`
}

// TenantBacklogged is the tenants with a backlog in a pool at every
// scrape over window, valued at their least backlog (every instance reads
// the same queues, hence max by): tenant_pool:sluice_tenant_backlogged:min5m
// over 5m.
func TenantBacklogged(window string) string {
	return `max by (namespace, job, tenant, pool) (min_over_time(sluice_tenant_backlog{tenant!="_other"}[` + window + `])) > 0`
}

// BackloggedService is service's series of the tenants backlogged says,
// and 0 for a backlogged tenant never served.
func BackloggedService(service, backlogged string) string {
	return service + " and on (namespace, job, tenant, pool) " + backlogged + " or on (namespace, job, tenant, pool) 0 * " + backlogged
}

// ServiceDifference is, per pool, the most less the least of the backlogged
// tenants' service: how far from fair sharing the queue is (VTC's measure).
func ServiceDifference(backloggedService string) string {
	return "max by (namespace, job, pool) (" + backloggedService + ") - min by (namespace, job, pool) (" + backloggedService + ")"
}

// PermitUtilisation is, per pool, the share of the time permits were held
// that their sequences spent decoding, over window (pools that held no
// permit have none): pool:sluice_permit_utilisation:ratio_rate5m over 5m.
func PermitUtilisation(window string) string {
	return `sum by (namespace, job, pool) (rate(sluice_permit_decoding_seconds_total[` + window + `])) / (sum by (namespace, job, pool) (rate(sluice_permit_held_seconds_total[` +
		window + `])) > 0)`
}

// Rows are the dashboard's panels, top to bottom.
var Rows = []Row{
	{Title: "Requests", Panels: []Panel{
		{Title: "Outcomes", Unit: "reqps", Axis: "requests/s", Width: 8,
			Description: "Chat requests per second by how they ended (sluice_requests_total).",
			Targets:     []Target{{`sum by (outcome) (rate(sluice_requests_total` + rate + `))`, "{{outcome}}"}}},
		{Title: "Goodput", Unit: "reqps", Axis: "requests/s", Width: 8,
			Description: "Requests answered in full per second, by pool (cache: answered from the answer cache).",
			Targets:     []Target{{`sum by (route) (rate(sluice_requests_total{outcome="done"}` + rate + `))`, "{{route}}"}}},
		{Title: "429s by dimension", Unit: "reqps", Axis: "requests/s", Width: 8,
			Description: "Requests refused at the door per second: by the rate-limit dimension that refused, and for a ban.",
			Targets: []Target{
				{`sum by (dimension) (rate(sluice_ratelimit_decisions_total{decision="deny"}` + rate + `))`, "{{dimension}}"},
				{`sum by (kind) (rate(sluice_banned_requests_total` + rate + `))`, "banned {{kind}}"},
			}},
	}},
	{Title: "Latency", Panels: []Panel{
		{Title: "Stage P50", Unit: "s", Axis: "seconds", Width: 8,
			Description: "Median time in each stage, all pools.",
			Targets:     []Target{{quantile("0.5", "stage, ", "sluice_stage_duration_seconds", ""), "{{stage}}"}}},
		{Title: "Stage P99", Unit: "s", Axis: "seconds", Width: 8,
			Description: "99th percentile of the time in each stage, all pools.",
			Targets:     []Target{{quantile("0.99", "stage, ", "sluice_stage_duration_seconds", ""), "{{stage}}"}}},
		{Title: "P99/P50 of the first token, per pool", Unit: "short", Axis: "P99 / P50 (ratio)", Width: 8, Thresholds: []float64{2, 5, 10},
			Description: "The tail ratio the healer and the alerts watch: warn above 2, critical above 5, collapse above 10.",
			Targets:     []Target{{tailRatio, "{{pool}}"}}},
		{Title: "Time to first token", Unit: "s", Axis: "seconds", Width: 12,
			Description: "From the request's start to its first token, the admission wait included, per pool (sluice_ttft_seconds).",
			Targets: []Target{
				{quantile("0.5", "pool, ", "sluice_ttft_seconds", ""), "P50 {{pool}}"},
				{quantile("0.99", "pool, ", "sluice_ttft_seconds", ""), "P99 {{pool}}"},
			}},
		{Title: "Tokens", Unit: "short", Axis: "tokens/s", Width: 12,
			Description: "LLM tokens per second by pool and kind (prompt, completion).",
			Targets:     []Target{{`sum by (pool, kind) (rate(sluice_llm_tokens_total` + rate + `))`, "{{pool}} {{kind}}"}}},
	}},
	{Title: "Admission", Panels: []Panel{
		{Title: "Queue depth", Unit: "short", Axis: "requests waiting", Width: 4,
			Description: "Requests waiting for a permit, per pool (read from Redis: every instance reports the same).",
			Targets:     []Target{{`max by (pool) (sluice_pool_queue_depth)`, "{{pool}}"}}},
		{Title: "Oldest wait", Unit: "s", Axis: "seconds", Width: 4,
			Description: "How long the longest-waiting request of each pool has queued.",
			Targets:     []Target{{`max by (pool) (sluice_pool_queue_oldest_wait_seconds)`, "{{pool}}"}}},
		{Title: "Permits in use", Unit: "short", Axis: "permits", Width: 5,
			Description: "LLM permits held and the pool's current limit (the healer lowers it at level 1).",
			Targets: []Target{
				{`max by (pool) (sluice_pool_permits_in_use)`, "in use {{pool}}"},
				{`max by (pool) (sluice_pool_permits_limit)`, "limit {{pool}}"},
			}},
		{Title: "Permit utilisation", Unit: "percentunit", Axis: "decoding share (0-1)", Width: 5,
			Description: "The share of the time permits were held that their sequences spent decoding, from the backend's first token to the stream's end. " +
				"The rest is prefill and queueing inside the backend, the wait for the first token, and the work around the stream while the permit is held " +
				"(docs/traffic.md, \"Permit utilisation\").",
			Targets: []Target{{PermitUtilisation(rateWindow), "{{pool}}"}}},
		{Title: "Queue wait P99 by tier", Unit: "s", Axis: "seconds", Width: 6,
			Description: "99th percentile of the admission wait per pool and tier (sluice_admission_wait_seconds).",
			Targets:     []Target{{quantile("0.99", "pool, tier, ", "sluice_admission_wait_seconds", ""), "{{pool}} {{tier}}"}}},
	}},
	{Title: "Tenants", Panels: []Panel{
		{Title: "Service per tenant and its difference", Unit: "short", Axis: "tokens/s per weight", Width: 16,
			Description: "Tokens per second each tenant is served in each pool, divided by its tier's weight (what fair queuing shares), and per pool the " +
				"difference between the most and the least served of the tenants backlogged for the whole interval: near 0 when the queue is fair. " +
				"Only tenants with series of their own (metrics.tenant_series, backlogged first) are drawn.",
			Targets: []Target{
				{TenantService(rateWindow), "{{tenant}} {{pool}}"},
				{ServiceDifference(BackloggedService(TenantService(rateWindow), "("+TenantBacklogged(rateWindow)+")")), "difference {{pool}}"},
			}},
		{Title: "Backlog per tenant", Unit: "short", Axis: "requests waiting", Width: 8,
			Description: "Requests of each tenant waiting for a free permit, per pool (entries parked behind the tier's max_concurrent excepted); " +
				"_other sums the tenants without series of their own.",
			Targets: []Target{{`max by (tenant, pool) (sluice_tenant_backlog)`, "{{tenant}} {{pool}}"}}},
	}},
	{Title: "Caches", Panels: []Panel{
		{Title: "Cache hit ratio per tier", Unit: "percentunit", Axis: "hit ratio (0-1)", Width: 12,
			Description: "Hits / lookups: embedding (L1), retrieval (L2) and answer cache.",
			Targets: []Target{{`sum by (tier) (rate(sluice_cache_hits_total` + rate + `)) / (sum by (tier) (rate(sluice_cache_hits_total` + rate +
				`)) + sum by (tier) (rate(sluice_cache_misses_total` + rate + `)))`, "{{tier}}"}}},
		{Title: "Cache bytes served", Unit: "Bps", Axis: "bytes/s", Width: 12,
			Description: "Bytes of cached values served per second, per tier.",
			Targets:     []Target{{`sum by (tier) (rate(sluice_cache_served_bytes_total` + rate + `))`, "{{tier}}"}}},
	}},
	{Title: "Healing and dependencies", Panels: []Panel{
		{Title: "Healing level", Unit: "short", Axis: "level (0-4)", Width: 8, Thresholds: []float64{1, 4},
			Description: "The healer's level per pool: 0 normal, 1 shrink, 2 throttle long, 3 scale, 4 shed. Its actions are the dashboard's annotations.",
			Targets:     []Target{{`max by (pool) (sluice_healing_level)`, "{{pool}}"}}},
		{Title: "Circuit breakers", Unit: "short", Axis: "state (0 closed, 2 open)", Width: 8, Thresholds: []float64{2},
			Description: "Each backend endpoint's breaker, worst over instances: 0 closed, 1 half-open, 2 open.",
			Targets:     []Target{{`max by (pool, endpoint) (sluice_backend_circuit_state)`, "{{pool}} {{endpoint}}"}}},
		{Title: "Redis and Temporal reachable", Unit: "short", Axis: "up (1) or down (0)", Width: 8,
			Description: "1 when every instance reached the dependency at its last scrape.",
			Targets:     []Target{{`min by (dependency) (sluice_dependency_up)`, "{{dependency}}"}}},
	}},
	{Title: "Temporal workers", Panels: []Panel{
		{Title: "Task slots", Unit: "short", Axis: "slots", Width: 6,
			Description: "Free and used execution slots per worker type (Temporal SDK).",
			Targets: []Target{
				{`sum by (worker_type) (temporal_worker_task_slots_available)`, "free {{worker_type}}"},
				{`sum by (worker_type) (temporal_worker_task_slots_used)`, "used {{worker_type}}"},
			}},
		{Title: "Schedule-to-start P99", Unit: "s", Axis: "seconds", Width: 6,
			Description: "How long tasks wait for a worker: rising means too few workers or slots.",
			Targets: []Target{
				{quantile("0.99", "", "temporal_workflow_task_schedule_to_start_latency_seconds", ""), "workflow task"},
				{quantile("0.99", "", "temporal_activity_schedule_to_start_latency_seconds", ""), "activity"},
			}},
		{Title: "Pollers and RPC failures", Unit: "short", Axis: "pollers; failures/s", Width: 6,
			Description: "Pollers per poller type, and the workers' failed calls to the Temporal frontend per second, by operation.",
			Targets: []Target{
				{`sum by (poller_type) (temporal_num_pollers)`, "pollers {{poller_type}}"},
				{`sum by (operation) (rate(temporal_request_failure_total` + rate + `))`, "failed {{operation}}/s"},
			}},
		{Title: "Sticky cache", Unit: "short", Axis: "workflows; hits/s", Width: 6,
			Description: "Workflows cached on workers, and workflow tasks per second that found theirs there (a replay avoided).",
			Targets: []Target{
				{`sum(temporal_sticky_cache_size)`, "size"},
				{`sum(rate(temporal_sticky_cache_hit_total` + rate + `))`, "hits/s"},
			}},
	}},
}

// Annotations mark the healer's actions and alerts on every panel.
var Annotations = []Annotation{
	{Name: "Healing actions", Color: "orange", Expr: newEvents("sluice_healing_actions_total", "pool, action"), Title: "{{action}} {{pool}}"},
	{Name: "Healing alerts", Color: "red", Expr: newEvents("sluice_healing_alerts_total", "pool, level"), Title: "{{level}} {{pool}}"},
}

// newEvents is a counter's events of the last minute. increase() cannot
// see a series' first event (the series appears with it, at 1), so the
// series that did not exist a minute ago are added.
func newEvents(counter, by string) string {
	return fmt.Sprintf("(sum by (%s) (increase(%s[1m])) > 0) or (sum by (%s) (%s unless %s offset 1m))",
		by, counter, by, counter, counter)
}

// Exprs lists every query of the dashboard as it sends it (scoped),
// panels then annotations.
func Exprs() []string {
	var out []string
	for _, r := range Rows {
		for _, p := range r.Panels {
			for _, t := range p.Targets {
				out = append(out, Scope(t.Expr))
			}
		}
	}
	for _, a := range Annotations {
		out = append(out, Scope(a.Expr))
	}
	return out
}

// panelHeight is every panel's height in grid units.
const panelHeight = 8

// JSON is the dashboard as Grafana imports it, indented.
func JSON() ([]byte, error) {
	d, err := build()
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode dashboard: %w", err)
	}
	return append(b, '\n'), nil
}

func build() (dashboard.Dashboard, error) {
	ds := datasource()
	b := dashboard.NewDashboardBuilder("Sluice").
		Uid(UID).
		Description("Sluice's requests, stages, admission queues, tenants' service, caches, healing and Temporal workers. Generated from deploy/grafana/dashboard.go.").
		Tags([]string{"sluice", "temporal"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair)
	for _, v := range variables(ds) {
		b.WithVariable(v)
	}
	for _, a := range Annotations {
		b.Annotation(dashboard.NewAnnotationQueryBuilder().
			Name(a.Name).Datasource(ds).Enable(true).IconColor(a.Color).
			Expr(Scope(a.Expr)).TitleFormat(a.Title).Step("1m"))
	}
	id := uint32(1)
	for _, r := range Rows {
		b.WithRow(dashboard.NewRowBuilder(r.Title).Id(id))
		id++
		for _, p := range r.Panels {
			b.WithPanel(panel(p, id, ds))
			id++
		}
	}
	d, err := b.Build()
	if err != nil {
		return dashboard.Dashboard{}, fmt.Errorf("build dashboard: %w", err)
	}
	return d, nil
}

func panel(p Panel, id uint32, ds common.DataSourceRef) *timeseries.PanelBuilder {
	pb := timeseries.NewPanelBuilder().
		Id(id).Title(p.Title).Description(p.Description).Datasource(ds).
		Unit(p.Unit).AxisLabel(p.Axis).Height(panelHeight).Span(uint32(p.Width)).
		FillOpacity(10).LineWidth(1).ShowPoints(common.VisibilityModeNever).
		Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom).ShowLegend(true))
	if len(p.Thresholds) > 0 {
		steps := []dashboard.Threshold{{Color: "green"}}
		colors := []string{"yellow", "orange", "red"}
		for i, v := range p.Thresholds {
			steps = append(steps, dashboard.Threshold{Value: &v, Color: colors[min(i+len(colors)-len(p.Thresholds), len(colors)-1)]})
		}
		pb.Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)).
			ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeDashed))
	}
	for i, t := range p.Targets {
		pb.WithTarget(prometheus.NewDataqueryBuilder().
			Datasource(ds).Expr(Scope(t.Expr)).LegendFormat(t.Legend).RefId(string(rune('A' + i))).Range())
	}
	return pb
}

// datasource is the $datasource variable, which every panel, query and
// annotation names.
func datasource() common.DataSourceRef {
	typ, uid := "prometheus", "${"+VarDatasource+"}"
	return common.DataSourceRef{Type: &typ, Uid: &uid}
}

// variables are the dashboard's: the Prometheus to read, then the
// namespaces, jobs and pools it has Sluice's series for, each narrowing
// the next.
func variables(ds common.DataSourceRef) []cog.Builder[dashboard.VariableModel] {
	provisioned, name := DatasourceUID, "Prometheus"
	out := []cog.Builder[dashboard.VariableModel]{
		dashboard.NewDatasourceVariableBuilder(VarDatasource).Label("Data source").Type("prometheus").
			Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: &name},
				Value: dashboard.StringOrArrayOfString{String: &provisioned}}),
	}
	all, allValue := "All", "$__all"
	query := func(v, label, q string) *dashboard.QueryVariableBuilder {
		return dashboard.NewQueryVariableBuilder(v).Label(label).Datasource(ds).
			Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: &all},
				Value: dashboard.StringOrArrayOfString{String: &allValue}}).
			Query(dashboard.StringOrMap{String: &q}).Definition(q).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).IncludeAll(true).AllValue(".*")
	}
	scope := VarNamespace + `=~"$` + VarNamespace + `"`
	return append(out,
		query(VarNamespace, "Namespace", "label_values(sluice_build_info, namespace)"),
		query(VarJob, "Job", "label_values(sluice_build_info{"+scope+"}, job)"),
		query(VarPool, "Pool", "label_values(sluice_pool_permits_limit{"+scope+`, job=~"$job"}, pool)`),
	)
}
