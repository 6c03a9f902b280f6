package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/deploy/grafana"
)

const (
	rulesPath          = "prometheus/sluice-rules.yaml"
	rulesTestPath      = "prometheus/sluice-rules.test.yaml"
	prometheusRulePath = "prometheus/sluice-prometheusrule.yaml"
	alertsDoc          = "../docs/alerts.md"
	runbookPrefix      = "https://github.com/sluice-dev/sluice/blob/main/docs/alerts.md#"
)

// promtool finds Prometheus's promtool: $SLUICE_TEST_PROMTOOL (make test
// sets it, and then a missing promtool fails the test), else promtool on
// PATH, else the test is skipped.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_TEST_PROMTOOL"); p != "" {
		path, err := exec.LookPath(p)
		if err != nil {
			t.Fatalf("SLUICE_TEST_PROMTOOL=%s: %v (deploy/dev/need.sh promtool installs it: apt-get install prometheus)", p, err)
		}
		return path
	}
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool (apt-get install prometheus; make test requires it)")
	}
	return path
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestAlertRulesWithPromtool(t *testing.T) {
	runPromtool(t, "check", "rules", rulesPath)
	runPromtool(t, "test", "rules", rulesTestPath)
}

// Every dashboard query parses: each is checked as a recording rule.
func TestDashboardQueriesWithPromtool(t *testing.T) {
	var rules []map[string]string
	for i, expr := range grafana.Exprs() {
		rules = append(rules, map[string]string{
			"record": fmt.Sprintf("dashboard:query_%d", i),
			"expr":   strings.ReplaceAll(expr, "$__rate_interval", "1m"),
		})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, "check", "rules", path)
}

type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
}

// The fairness rules record what the dashboard's Tenants panel draws: the
// same expressions (grafana.TenantService and the rest) over 5 minutes,
// each rule reading the one before it; the utilisation rule what its
// Permit utilisation panel draws.
func TestFairnessRulesMatchDashboard(t *testing.T) {
	var rg ruleGroups
	loadYAML(t, rulesPath, &rg)
	exprs := map[string]string{}
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				exprs[r.Record] = r.Expr
			}
		}
	}
	const (
		service    = "tenant_pool:sluice_tenant_service:rate5m"
		backlogged = "tenant_pool:sluice_tenant_backlogged:min5m"
		both       = "tenant_pool:sluice_tenant_backlogged_service:rate5m"
	)
	want := map[string]string{
		service:    grafana.TenantService("5m"),
		backlogged: grafana.TenantBacklogged("5m"),
		both:       grafana.BackloggedService(service, backlogged),
		"pool:sluice_tenant_service_difference:rate5m": grafana.ServiceDifference(both),
		"pool:sluice_permit_utilisation:ratio_rate5m":  grafana.PermitUtilisation("5m"),
	}
	squash := func(s string) string { return strings.Join(strings.Fields(s), "") }
	for record, expr := range want {
		got, ok := exprs[record]
		if !ok {
			t.Errorf("%s: no rule records %s", rulesPath, record)
			continue
		}
		if squash(got) != squash(expr) {
			t.Errorf("%s: %s is\n%s\nbut the dashboard computes\n%s", rulesPath, record, got, expr)
		}
	}
}

// The PrometheusRule carries exactly the plain rules' groups.
func TestPrometheusRuleMatchesRules(t *testing.T) {
	var plain struct {
		Groups any `yaml:"groups"`
	}
	loadYAML(t, rulesPath, &plain)
	var pr struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Spec struct {
			Groups any `yaml:"groups"`
		} `yaml:"spec"`
	}
	loadYAML(t, prometheusRulePath, &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata.Name == "" {
		t.Errorf("%s: %s %s %q, want a named monitoring.coreos.com/v1 PrometheusRule", prometheusRulePath, pr.APIVersion, pr.Kind, pr.Metadata.Name)
	}
	if plain.Groups == nil || !reflect.DeepEqual(plain.Groups, pr.Spec.Groups) {
		t.Errorf("%s: spec.groups differ from %s's groups; copy them over", prometheusRulePath, rulesPath)
	}
}

// Every alert has a severity, a summary, and a runbook_url that is a
// section of docs/alerts.md; every section there is an alert's.
func TestAlertRunbooks(t *testing.T) {
	var rg ruleGroups
	loadYAML(t, rulesPath, &rg)
	anchors := markdownAnchors(t, alertsDoc)
	var alerts []string
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: alert %s has severity %q, want warning or critical", rulesPath, r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: alert %s has no summary", rulesPath, r.Alert)
			}
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, runbookPrefix)
			if !ok || anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: alert %s has runbook_url %q, want %s%s", rulesPath, r.Alert, url, runbookPrefix, strings.ToLower(r.Alert))
				continue
			}
			if !slices.Contains(anchors, anchor) {
				t.Errorf("%s: alert %s's runbook %s has no section (## %s) in %s", rulesPath, r.Alert, url, r.Alert, alertsDoc)
			}
		}
	}
	for _, a := range anchors {
		if strings.HasPrefix(a, "sluice") && !slices.ContainsFunc(alerts, func(name string) bool { return strings.ToLower(name) == a }) {
			t.Errorf("%s: section #%s names no alert of %s", alertsDoc, a, rulesPath)
		}
	}
}

var headingRE = regexp.MustCompile(`(?m)^#{2,3} (.+)$`)

// markdownAnchors returns the GitHub anchors of a document's level 2 and
// 3 headings.
func markdownAnchors(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range headingRE.FindAllStringSubmatch(string(raw), -1) {
		a := strings.ToLower(strings.TrimSpace(m[1]))
		a = strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				return r
			}
			return -1
		}, a)
		out = append(out, a)
	}
	return out
}

// The compose file's prometheus and grafana services mount files that
// exist: the scrape config, the rules, Grafana's provisioning and the
// dashboard; Prometheus scrapes the API and the worker where they listen.
func TestComposeMonitoring(t *testing.T) {
	cf := loadCompose(t)
	want := map[string][]string{
		"prometheus": {"/etc/prometheus/prometheus.yml", "/etc/prometheus/sluice-rules.yaml"},
		"grafana":    {"/etc/grafana/provisioning", "/var/lib/grafana/dashboards/sluice.json"},
	}
	for name, targets := range want {
		svc, ok := cf.Services[name]
		if !ok {
			t.Errorf("%s: no service %q", composePath, name)
			continue
		}
		mounted := map[string]string{}
		for _, v := range svc.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				t.Errorf("%s: %s volume %q is not source:target", composePath, name, v)
				continue
			}
			src := filepath.Join(filepath.Dir(composePath), parts[0])
			if _, err := os.Stat(src); err != nil {
				t.Errorf("%s: %s mounts %s, which does not exist: %v", composePath, name, parts[0], err)
			}
			mounted[parts[1]] = src
		}
		for _, target := range targets {
			if _, ok := mounted[target]; !ok {
				t.Errorf("%s: %s does not mount anything at %s", composePath, name, target)
			}
		}
	}
	var prom struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	loadYAML(t, "prometheus/prometheus.yml", &prom)
	if !slices.Contains(prom.RuleFiles, "/etc/prometheus/sluice-rules.yaml") {
		t.Errorf("prometheus/prometheus.yml: rule_files %v lacks the mounted rules", prom.RuleFiles)
	}
	var targets []string
	for _, sc := range prom.ScrapeConfigs {
		for _, s := range sc.StaticConfigs {
			targets = append(targets, s.Targets...)
		}
	}
	_, apiPort, _ := strings.Cut(cf.Services["sluice-api"].Environment["SLUICE_METRICS_ADDR"], ":")
	_, workerPort, _ := strings.Cut(cf.Services["sluice-worker"].Environment["SLUICE_METRICS_WORKER_ADDR"], ":")
	for _, want := range []string{"sluice-api:" + apiPort, "sluice-worker:" + workerPort} {
		if !slices.Contains(targets, want) {
			t.Errorf("prometheus/prometheus.yml scrapes %v, want %s (where the service listens)", targets, want)
		}
	}
	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	loadYAML(t, "grafana/provisioning/datasources/prometheus.yaml", &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].UID != grafana.DatasourceUID || ds.Datasources[0].Type != "prometheus" ||
		ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Errorf("grafana provisioning: datasources %+v, want one prometheus at http://prometheus:9090 with uid %s", ds.Datasources, grafana.DatasourceUID)
	}
}
