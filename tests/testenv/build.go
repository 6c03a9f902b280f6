package testenv

import (
	"os/exec"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/version"
)

// Build names the tree a measurement ran on: the version make stamps
// (v0.1.0-16e4d0d), or, in a binary built without it (go test, go run),
// the source's version with git's HEAD after it, the same shape. A report
// that names no commit cannot be checked for staleness (tests/docs).
func Build() string {
	if strings.Contains(version.Version, "-") {
		return version.Version
	}
	commit := "dev"
	if root, err := RepoRoot(); err == nil {
		if out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output(); err == nil {
			commit = strings.TrimSpace(string(out))
		}
	}
	return version.Version + "-" + commit
}

// RunLine is a report's line saying when and on which tree it ran
// ("run: 2026-12-05 00:43 UTC, sluice v0.1.0-16e4d0d"); tests/docs reads
// it to tell a stale report.
func RunLine(start time.Time) string {
	return "run: " + start.UTC().Format("2006-01-02 15:04 MST") + ", sluice " + Build()
}
