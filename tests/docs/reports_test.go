package docs

import (
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// runLine is a report's `run:` line, as sluice-bench writes it:
// "run: 2026-12-05 00:43 UTC, sluice v0.1.0-16e4d0d". Group 1 is the
// date, 2 the build. Text may follow the build (a line written after the
// run says where its commit came from).
var runLine = regexp.MustCompile(`(?m)^run: (\d{4}-\d{2}-\d{2})(?: \d{2}:\d{2})? UTC, sluice (\S+?)[,;.]?(?:\s|$)`)

// buildCommit is the commit a build names: make's stamp
// (v0.1.0-16e4d0d), git describe's (v0.1.0-5-g16e4d0d, -dirty after
// either), or a bare commit id for a tree older than the first release;
// a bare release version names its tag.
var (
	buildCommit = regexp.MustCompile(`^(?:v\d+\.\d+\.\d+(?:-\d+-g|-))?([0-9a-f]{7,40})(?:-dirty)?$`)
	release     = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
)

// run is what a report says about the tree it measured.
type run struct {
	date time.Time
	rev  string // a commit id, or a release tag
}

// parseRun reads a report's run line.
func parseRun(report string) (run, error) {
	m := runLine.FindStringSubmatch(report)
	if m == nil {
		return run{}, errors.New("no `run: <date> UTC, sluice <version>` line: the figures are tied to no tree")
	}
	date, err := time.Parse(time.DateOnly, m[1])
	if err != nil {
		return run{}, fmt.Errorf("run line: %w", err)
	}
	if c := buildCommit.FindStringSubmatch(m[2]); c != nil {
		return run{date: date, rev: c[1]}, nil
	}
	if release.MatchString(m[2]) {
		return run{date: date, rev: m[2]}, nil
	}
	return run{}, fmt.Errorf("run line: version %q names no commit", m[2])
}

// errNoHistory means git cannot say how far a commit is behind: no git,
// or a shallow clone without the commit.
var errNoHistory = errors.New("no history")

// git runs git in repo and returns its trimmed output.
func git(repo string, args ...string) (string, error) {
	out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(exit.Stderr)))
	}
	return strings.TrimSpace(string(out)), err
}

// commitsSince counts the commits on HEAD after rev that touch paths.
// Without git, or in a shallow clone that lacks rev, it returns
// errNoHistory; in a full clone an unknown rev is an error of the report.
func commitsSince(repo, rev string, paths []string) (int, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return 0, fmt.Errorf("%w: git is not installed", errNoHistory)
	}
	if _, err := git(repo, "rev-parse", "--verify", "--quiet", rev+"^{commit}"); err != nil {
		shallow, serr := git(repo, "rev-parse", "--is-shallow-repository")
		if serr != nil {
			return 0, fmt.Errorf("%w: %v", errNoHistory, serr)
		}
		if shallow == "true" {
			return 0, fmt.Errorf("%w: shallow clone without %s", errNoHistory, rev)
		}
		return 0, fmt.Errorf("no commit %s in this repository", rev)
	}
	out, err := git(repo, append([]string{"rev-list", "--count", rev + "..HEAD", "--"}, paths...)...)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(out)
}
