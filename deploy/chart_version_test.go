package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sluice-dev/sluice/pkg/version"
)

// The chart is released with the binaries: its appVersion, the image tag
// its default values pull, is the release the source says (pkg/version,
// which the CHANGELOG's newest release keeps), and its version is that
// release without the "v".
func TestChartFollowsTheVersion(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(helmChart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &chart); err != nil {
		t.Fatal(err)
	}
	release, _, _ := strings.Cut(version.Version, "-")
	if chart.AppVersion != release || chart.Version != strings.TrimPrefix(release, "v") {
		t.Fatalf("Chart.yaml version %q appVersion %q, want %q and %q (pkg/version)",
			chart.Version, chart.AppVersion, strings.TrimPrefix(release, "v"), release)
	}
	values, err := os.ReadFile(filepath.Join(helmChart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Image struct {
			Tag *string `json:"tag"`
		} `json:"image"`
	}
	if err := yaml.Unmarshal(values, &v); err != nil {
		t.Fatal(err)
	}
	if v.Image.Tag == nil || *v.Image.Tag != "" {
		t.Fatalf("values.yaml image.tag %v, want \"\" (the chart's appVersion)", v.Image.Tag)
	}
}
