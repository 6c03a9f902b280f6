package version

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The unstamped version is the newest release the CHANGELOG names, so a
// release is cut by changing both together (and the Helm chart's
// versions, which deploy/chart_version_test.go holds to this one).
func TestVersionIsTheChangelogsNewestRelease(t *testing.T) {
	raw, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\]`).FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatal("CHANGELOG.md names no release (## [X.Y.Z])")
	}
	if want := "v" + m[1]; Version != want && !strings.HasPrefix(Version, want+"-") {
		t.Fatalf("Version %q, the CHANGELOG's newest release is %s", Version, want)
	}
}

func TestGetNamesTheBuild(t *testing.T) {
	defer func(v, c string) { Version, Commit = v, c }(Version, Commit)
	Version, Commit = "v9.8.7-abc1234", "abc1234"
	i := Get()
	if i.Version != "v9.8.7-abc1234" || i.Commit != "abc1234" || !strings.HasPrefix(i.GoVersion, "go") {
		t.Fatalf("info %+v", i)
	}
	if got, want := Line("sluice-api"), "sluice-api v9.8.7-abc1234 (commit abc1234, "+i.GoVersion+")"; got != want {
		t.Fatalf("line %q, want %q", got, want)
	}
	Commit = ""
	if c := Get().Commit; c == "" {
		t.Fatal("an unstamped build's commit is empty, want the recorded revision or unknown")
	}
}

func TestAsked(t *testing.T) {
	for args, want := range map[string]bool{
		"version": true, "-version": true, "--version": true,
		"": false, "-config x.yaml": false, "serve version": false, "-v": false,
	} {
		if got := Asked(strings.Fields(args)); got != want {
			t.Errorf("Asked(%q) = %v, want %v", args, got, want)
		}
	}
}
