package version

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The unstamped version is the newest release the CHANGELOG names, so a
// release is cut by changing both together.
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
