package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// realPassage is docs/performance.md, which must still hold want: the
// passage a test rewrites.
func realPassage(t *testing.T, want string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "docs", "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	if !strings.Contains(text, want) {
		t.Fatalf("docs/performance.md no longer says %q: point this test at the passage that does", want)
	}
	return text
}

// fresh serves the real reports, none of them stale.
var fresh = reports{read: readFromRoot, stale: func(string) string { return "" }}

// TestRowCheckCatchesASwappedVerdict: the real passages pass, and the
// rewrites that keep every number in the report but move it to another
// part of the claim fail.
func TestRowCheckCatchesASwappedVerdict(t *testing.T) {
	for _, tc := range []struct{ real, rewritten string }{
		{"**1.36×** (goal ≤ 1.25×, **missed**)", "**1.25×** (goal ≤ 1.36×, **met**)"},
		{"| 68.8% — missed |", "| 68.8% — met |"},
		{"**1.36×** (goal ≤ 1.25×, **missed**)", "**1.36×** (goal ≤ 1.25×, **met**)"},
		{"at 2× P **1.00×** (goal ≥ 0.9×, met)", "at 2× P **1.00×** (goal ≥ 0.9×, missed)"},
		{"| 21.78× — met |", "| 21.78× — missed |"},
		{"| met |\n| limiter p99", "| missed |\n| limiter p99"},
		{"the drain rate met its goal (21.4/s = 1.08×", "the drain rate missed its goal (21.4/s = 1.08×"},
	} {
		text := realPassage(t, tc.real)
		if p := checkQuotes("docs/performance.md", text, fresh); len(p) > 0 {
			t.Fatalf("the real docs/performance.md fails:\n%s", strings.Join(p, "\n"))
		}
		got := checkQuotes("docs/performance.md", strings.Replace(text, tc.real, tc.rewritten, 1), fresh)
		if !strings.Contains(strings.Join(got, "\n"), "no line of tests/load/report/") {
			t.Errorf("%q rewritten as %q passed the check (%q)", tc.real, tc.rewritten, got)
		}
	}
}

// TestRowCheckPassesCompoundClaims: several verdicts in one sentence are
// read one by one, each with its own figure.
func TestRowCheckPassesCompoundClaims(t *testing.T) {
	read := func(string) (string, error) {
		return "a at 2x: 0.89× (goal >= 0.9×) — MISSED\na at 8x: 0.94× (goal >= 0.9×) — met\n", nil
	}
	src := reports{read: read, stale: func(string) string { return "" }}
	ok := "At 2× **0.89×** (goal ≥ 0.9×, missed) and at 8× 0.94× (met) ([report](../tests/load/report/x.md))."
	if p := checkQuotes("docs/perf.md", ok, src); len(p) > 0 {
		t.Errorf("%s", strings.Join(p, "\n"))
	}
	bad := "At 2× 0.89× and 0.94× (goal ≥ 0.9×, missed) ([report](../tests/load/report/x.md))."
	if p := checkQuotes("docs/perf.md", bad, src); len(p) != 1 {
		t.Errorf("0.94× judged missed passed: %q", p)
	}
}

// TestStaleReportMustBeMarkedWhereQuoted: a figure quoted from a stale
// report fails unless its unit says it is stale.
func TestStaleReportMustBeMarkedWhereQuoted(t *testing.T) {
	const passage = "**1.36×** (goal ≤ 1.25×, **missed**)"
	text := realPassage(t, passage)
	stale := reports{read: readFromRoot, stale: func(r string) string {
		if r == reportDir+"/overhead.md" {
			return "ran 200 commits ago"
		}
		return ""
	}}
	got := strings.Join(checkQuotes("docs/performance.md", text, stale), "\n")
	if !strings.Contains(got, "overhead.md, which is stale (ran 200 commits ago)") {
		t.Errorf("a quote of a stale report passed unmarked: %q", got)
	}
	marked := strings.Replace(text, passage, passage+" (stale: the code moved since)", 1)
	line := 0
	for _, u := range units(marked, "docs") {
		if strings.Contains(u.text, passage) {
			line = u.line
		}
	}
	at := fmt.Sprintf("docs/performance.md:%d: quotes", line)
	for _, p := range checkQuotes("docs/performance.md", marked, stale) {
		if strings.HasPrefix(p, at) {
			t.Errorf("the marked quote still fails: %s", p)
		}
	}
}
