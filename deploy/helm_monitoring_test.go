package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The chart's dashboard and rules are copies of the one source of each
// (Helm reads only files inside the chart); `make chart-files` copies
// them.
var chartCopies = map[string]string{
	"grafana/sluice.json":          "helm/sluice/files/sluice.json",
	"prometheus/sluice-rules.yaml": "helm/sluice/files/sluice-rules.yaml",
}

func TestChartMonitoringFilesAreCopies(t *testing.T) {
	for src, copied := range chartCopies {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(copied)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s: run make chart-files", copied, src)
		}
	}
}

// With grafanaDashboard and prometheusRule on (the production values), the
// chart renders the dashboard in a ConfigMap with the sidecar's label and
// the rules' groups in a PrometheusRule, each exactly its source; with the
// defaults, neither.
func TestChartShipsDashboardAndRules(t *testing.T) {
	render := func(values ...string) *rendered {
		args := append([]string{"template", helmRelease, helmChart, "--namespace", helmNamespace}, values...)
		out, err := runHelm(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		return decodeRendered(t, out)
	}
	r := render()
	if _, ok := r.configMaps[helmRelease+"-dashboard"]; ok || len(r.rules) > 0 {
		t.Errorf("the default values render the dashboard or the rules")
	}
	r = render("-f", "helm/sluice/ci/production-values.yaml")
	cm, ok := r.configMaps[helmRelease+"-dashboard"]
	if !ok {
		t.Fatal("no dashboard ConfigMap with grafanaDashboard.enabled")
	}
	if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "Sluice" {
		t.Errorf("dashboard ConfigMap labels %v annotations %v: want grafana_dashboard 1 and the values' folder", cm.Labels, cm.Annotations)
	}
	dashboard, err := os.ReadFile("grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["sluice.json"] != strings.TrimSuffix(string(dashboard), "\n") || !json.Valid([]byte(cm.Data["sluice.json"])) {
		t.Errorf("the ConfigMap's sluice.json is not grafana/sluice.json")
	}
	if len(r.rules) != 1 {
		t.Fatalf("%d PrometheusRules with prometheusRule.enabled, want 1", len(r.rules))
	}
	pr := r.rules[0]
	if pr.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v: want the values' release label", pr.Labels)
	}
	var plain struct {
		Groups []any `json:"groups"`
	}
	raw, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &plain); err != nil {
		t.Fatal(err)
	}
	spec, err := json.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var rendered struct {
		Groups []any `json:"groups"`
	}
	if err := json.Unmarshal(spec, &rendered); err != nil {
		t.Fatal(err)
	}
	if len(plain.Groups) == 0 || !reflect.DeepEqual(normalise(t, plain.Groups), normalise(t, rendered.Groups)) {
		t.Errorf("the PrometheusRule's groups are not %s's", rulesPath)
	}
}

// normalise is v through JSON, so that values decoded two ways compare.
func normalise(t *testing.T, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
