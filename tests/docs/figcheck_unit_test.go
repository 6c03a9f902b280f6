package docs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A report and a doc quoting it, small enough to read: the checker must
// pass the right figures and catch a wrong one, or it checks nothing.
const syntheticReport = "# sluice-bench burst\n\n```\n" +
	"sluice-bench burst: 2000 concurrent SSE clients, 20 permits, max_wait 30s\n" +
	"command: bin/sluice-bench burst -report tests/load/report/burst.md\n" +
	"run: 2026-12-05 00:43 UTC, sluice v0.1.0-16e4d0d\n" +
	"machine: 2 CPUs\n\n" +
	"| outcome | clients | share | p50 |\n|---|---|---|---|\n" +
	"| done | 647 | 32.4% | 16814.1 ms |\n" +
	"| rejected | 1353 | 67.7% | 30414.5 ms |\n" +
	"served rate while draining / rate at one client per permit: 21.7/s / 22.9/s = 0.95x (goal >= 0.8x) — met\n```\n"

func syntheticRead(p string) (string, error) {
	if p == "tests/load/report/burst.md" {
		return syntheticReport, nil
	}
	return "", fmt.Errorf("%s: no such report", p)
}

// synthetic serves syntheticReport, fresh.
var synthetic = reports{read: syntheticRead, stale: func(string) string { return "" }}

func TestQuoteCheckerPassesTheReportsFigures(t *testing.T) {
	doc := "# Perf\n\n" +
		"All at once (`make bench-burst`, 2026-12-05, [report](../tests/load/report/burst.md)):\n" +
		"**647** answers, 1,353 rejected at their 30 s `max_wait`, drained at\n" +
		"21.7 answers/s = 0.95× the 22.90/s of a closed loop.\n\n" +
		"- a list item quoting [the same report](../tests/load/report/burst.md): 2,000 clients, 20 permits\n\n" +
		"Its table ([report](../tests/load/report/burst.md)):\n\n" +
		"| outcome | clients | share |\n|---|---|---|\n| done | 647 | 32.4% |\n| rejected | 1,353 | 67.7 % |\n\n" +
		"A paragraph with no link may say 17 anything, and so may `code 99 ms`.\n\n" +
		"Code spans may run over a line: `sluice-bench burst -n\n99` ([report](../tests/load/report/burst.md)).\n"
	if p := checkQuotes("docs/perf.md", doc, synthetic); len(p) > 0 {
		t.Errorf("figures that are in the report were refused:\n%s", strings.Join(p, "\n"))
	}
}

func TestQuoteCheckerCatchesDrift(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"Drained at 0.96× ([report](../tests/load/report/burst.md)).", "docs/perf.md:1: 0.96 is not in"},
		{"Drained at 21.70 answers/s, 22 a permit ([report](../tests/load/report/burst.md)).", "docs/perf.md:1: 22 is not in"},
		// a rounded figure is a different figure: quote the report's
		{"p50 16,814 ms ([report](../tests/load/report/burst.md)).", "16814 is not in"},
		{"On 2026-11-29 ([report](../tests/load/report/burst.md)): 647 answers.", "the date 2026-11-29 is not in"},
		// a table takes its caption's report
		{"Measured ([report](../tests/load/report/burst.md)):\n\n| a | b |\n|---|---|\n| done | 648 |\n", "docs/perf.md:5: 648 is not in"},
		// and only its caption: after a code block or a heading, none
		{"Measured ([report](../tests/load/report/burst.md)):\n\n```\nx\n```\n\n| a |\n|---|\n| 7 |\n\nThen ([report](../tests/load/report/burst.md)) 9.", "docs/perf.md:11: 9 is not in"},
		// a list item is checked on its own
		{"- first ([report](../tests/load/report/burst.md)): 647\n- second, 5 answers, links nothing\n- third ([report](../tests/load/report/burst.md)): 646\n", "docs/perf.md:3: 646 is not in"},
		{"See [it](../tests/load/report/heal.md): 5 ms.", "no such report"},
	} {
		got := strings.Join(checkQuotes("docs/perf.md", tc.doc, synthetic), "\n")
		if !strings.Contains(got, tc.want) {
			t.Errorf("doc %q:\ngot  %q\nwant %q", tc.doc, got, tc.want)
		}
	}
	// an unlinked list item, and a table after a code block, are not
	// checked: neither quotes a report
	for _, doc := range []string{
		"- first ([report](../tests/load/report/burst.md)): 647\n- second: 5 answers\n",
		"Measured ([report](../tests/load/report/burst.md)):\n\n```\nx\n```\n\n| a |\n|---|\n| 7 |\n",
	} {
		if p := checkQuotes("docs/perf.md", doc, synthetic); len(p) > 0 {
			t.Errorf("%q: a unit that links no report was checked: %v", doc, p)
		}
	}
}

func TestFiguresNormalise(t *testing.T) {
	for text, want := range map[string][]string{
		"1,353 and 1353.0 and 24.750/s":           {"1353", "1353", "24.75"},
		"0.95× and 0.95x, 32.4 % and 32.4%":       {"0.95", "0.95", "32.4", "32.4"},
		"at 0.5,1,2 × P":                          {"0.5", "1", "2"},
		"P99 of L2, v0.1.0, 5xx, 16e4d0d, 3rd":    nil,
		"on 2026-12-05, 107.1 MiB, 30 s, 4–14 ms": {"107.1", "30", "4", "14"},
	} {
		if got := figures(text); !slices.Equal(got, want) {
			t.Errorf("figures(%q) = %q, want %q", text, got, want)
		}
	}
	if got := figures("for 1m30s, -0.00 MiB"); !slices.Equal(got, []string{"1", "30", "0"}) {
		t.Errorf("durations: %q", got)
	}
}

func TestUnlinkedBenchFigureIsCaught(t *testing.T) {
	benches := map[string]string{"burst": "tests/load/report/burst.md"}
	doc := "`make bench-burst` drained at 0.81× the steady rate.\n\n" +
		"`make bench-burst` sends 2,000 clients.\n\n" +
		"`make bench-go` measures 9 µs.\n\n" +
		"`make bench-burst` drained at 0.95× ([report](../tests/load/report/burst.md)).\n"
	got := checkUnlinked("docs/perf.md", doc, benches)
	if len(got) != 1 || !strings.Contains(got[0], "docs/perf.md:1:") || !strings.Contains(got[0], "0.81×") {
		t.Errorf("want one problem, on line 1 (0.81×), got %q", got)
	}
}

func TestRunLineParses(t *testing.T) {
	for line, want := range map[string]string{
		"run: 2026-12-05 00:43 UTC, sluice v0.1.0-16e4d0d":                      "16e4d0d",
		"run: 2026-12-01 UTC, sluice v0.1.0-be2c6ba (from git: committed in x)": "be2c6ba",
		"run: 2026-12-01 UTC, sluice v0.2.0-3-gabc1234-dirty":                   "abc1234",
		"run: 2026-12-01 UTC, sluice v0.2.0":                                    "v0.2.0",
		"run: 2026-11-30 UTC, sluice 2a77b96 (before the first release)":        "2a77b96",
	} {
		r, err := parseRun("# r\n\n" + line + "\n")
		if err != nil || r.rev != want {
			t.Errorf("%q: rev %q, %v; want %q", line, r.rev, err, want)
		}
	}
	for _, bad := range []string{"Generated on 2026-12-01.", "run: 2026-12-01 UTC, sluice dev", "run: 2026-13-01 UTC, sluice v0.1.0-abcdef1"} {
		if _, err := parseRun(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestStaleReportIsCaught builds a small repository: a report's commit
// then commits on a measured path and on another one; only the former
// count, and past the bound the report is stale.
func TestStaleReportIsCaught(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	repo := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		out, err := git(repo, append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	commit := func(file string) {
		t.Helper()
		p := filepath.Join(repo, file)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		old, _ := os.ReadFile(p)
		if err := os.WriteFile(p, append(old, 'x'), 0o644); err != nil {
			t.Fatal(err)
		}
		run("add", file)
		run("commit", "-q", "-m", file)
	}
	run("init", "-q")
	commit("door/door.go")
	ran := run("rev-parse", "--short", "HEAD")
	for range 3 {
		commit("door/door.go")
		commit("docs/readme.md")
	}
	s := scenario{command: "make bench-door", measures: []string{"door/"}}
	report := "# r\n\nrun: 2026-12-05 00:43 UTC, sluice v0.1.0-" + ran + "\n"
	if n, problem, err := freshness(repo, "r.md", report, s, 3); n != 3 || problem != "" || err != nil {
		t.Errorf("3 commits on door/ since the run, bound 3 (the docs commits do not count): %d, %q, %v", n, problem, err)
	}
	if _, problem, err := freshness(repo, "r.md", report, s, 2); !strings.Contains(problem, "3 commits since touch what it measures (door/), more than 2") || err != nil {
		t.Errorf("3 commits on door/ since the run, bound 2: %q, %v; want stale", problem, err)
	}
	unknown := "# r\n\nrun: 2026-12-05 00:43 UTC, sluice v0.1.0-0123abc\n"
	if _, problem, err := freshness(repo, "r.md", unknown, s, 2); !strings.Contains(problem, "no commit 0123abc") || err != nil {
		t.Errorf("an unknown commit in a full clone: %q, %v; want an error of the report", problem, err)
	}
	if _, problem, _ := freshness(repo, "r.md", "# r\n\nGenerated on 2026-12-05.\n", s, 2); !strings.Contains(problem, "r.md: no `run:") {
		t.Errorf("a report without a run line: %q", problem)
	}
}
