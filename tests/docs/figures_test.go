package docs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// maxCommitsBehind is how many commits touching what a report measures may
// land after the tree it ran on before its figures count as stale. Most
// commits leave a bench's figures where they were (docs, tests, other
// packages), so only commits on the measured paths count; 150 of those is
// days to weeks of work at this project's pace on the hot path: enough
// change that the figures may no longer describe the code, yet not so
// few that every refactor owes a 30-minute bench run. Past it, re-run the
// report's command and commit the report (and the docs quoting it).
const maxCommitsBehind = 150

// scenario is a report under tests/load/report/ and what its figures
// depend on. A scenario keeps one report, its current one: an earlier
// run's figures are in git's history of the file.
type scenario struct {
	bench    string   // how the docs name it: make bench-<bench>, sluice-bench <bench>
	report   string   // its file under tests/load/report/; "" if it writes none yet
	command  string   // what measures it again
	measures []string // the code it drives and the bench itself, from the root
}

// The paths a scenario measures: the request path it drives, then its
// own code. A change anywhere else does not move its figures.
var (
	requestPath = []string{"api/", "door/", "workflows/", "activities/", "pkg/admission/", "pkg/waitroom/", "pkg/events/"}
	// The bench's scenario families (sluice-bench's packages).
	overheadCode = "tests/load/overhead/"
	goodputCode  = "tests/load/goodput/"
	fairnessCode = "tests/load/fairness/"
	healCode     = "tests/load/heal/"
	// sloMeasures is what both slo workloads drive and measure with.
	sloMeasures = append(slices.Clone(requestPath), "pkg/waitroom/", "pkg/llmsim/", fairnessCode+"slo.go", fairnessCode+"sloload.go", fairnessCode+"sloreport.go",
		fairnessCode+"slogoals.go", fairnessCode+"slotables.go", fairnessCode+"sloideal.go", fairnessCode+"sloworkload.go", "tests/load/internal/slo/")
	// bareCode is the bare workflow the overhead and goodput scenarios
	// measure Sluice against.
	bareCode = "tests/load/internal/bare/"
	// vtcCode replays the VTC workloads and computes their metrics for
	// sluice-bench fairness and the cluster stack's replay alike.
	vtcCode = "tests/load/vtc/"
)

var scenarios = []scenario{
	{bench: "overhead", report: "overhead.md", command: "make bench-overhead",
		measures: append(slices.Clone(requestPath), overheadCode+"overhead.go", bareCode)},
	{bench: "limiter", report: "limiter.md", command: "make bench-limiter",
		measures: []string{"pkg/limiter/", overheadCode + "limiter.go"}},
	{bench: "reject", report: "reject.md", command: "make bench-reject",
		measures: []string{"api/", "door/", "pkg/limiter/", overheadCode + "reject.go", overheadCode + "wrk.go"}},
	{bench: "wakeup", report: "wakeup.md", command: "make bench-wakeup",
		measures: []string{"pkg/admission/", "activities/admit.go", "workflows/", "app/", "worker/", overheadCode + "wakeup.go", overheadCode + "holders.go"}},
	{bench: "burst", report: "burst.md", command: "make bench-burst",
		measures: append(slices.Clone(requestPath), "pkg/limiter/", goodputCode+"burst.go")},
	{bench: "waiters", command: "make bench-waiters"},
	{bench: "heal", report: "heal.md", command: "make bench-heal",
		measures: []string{"workflows/", "activities/", "app/", "worker/", "pkg/latency/", "pkg/scaler/", "pkg/admission/", healCode + "heal.go", healCode + "report.go", healCode + "status.go"}},
	{bench: "goodput", report: "goodput.md", command: "make bench-goodput",
		measures: append(slices.Clone(requestPath), goodputCode+"goodput.go", goodputCode+"goodputload.go", goodputCode+"goodputhist.go", bareCode)},
	{bench: "soak", report: "soak.md", command: "make bench-soak",
		measures: append(slices.Clone(requestPath), "app/", "worker/", goodputCode+"soak.go", goodputCode+"soaksample.go")},
	{bench: "cluster", report: "cluster-goodput.md", command: "make bench-cluster",
		measures: append(slices.Clone(requestPath), "app/", "worker/", "tests/multi/goodput_test.go", "tests/multi/cpu_test.go")},
	{bench: "pools", report: "pools.md", command: "make bench-pools",
		measures: append(slices.Clone(requestPath), "pkg/config/pools.go", fairnessCode+"pools.go", fairnessCode+"poolsreport.go", fairnessCode+"poolsutil.go")},
	{bench: "slo", report: "slo.md", command: "make bench-slo", measures: sloMeasures},
	{bench: "slo-vtc", report: "slo-vtc.md", command: "make bench-slo-vtc", measures: sloMeasures},
	{bench: "fairness", report: "fairness.md", command: "make bench-fairness",
		measures: append(slices.Clone(requestPath), "pkg/llmsim/", vtcCode, fairnessCode+"fairness.go", fairnessCode+"fairreport.go")},
	{bench: "fairness", report: "fairness-1024.md", command: "make bench-fairness-1024",
		measures: append(slices.Clone(requestPath), "pkg/llmsim/", vtcCode, fairnessCode+"fairness.go", fairnessCode+"fairreport.go")},
	{bench: "fairness", report: "fairness-omitted.md", command: "make bench-fairness-omitted",
		measures: append(slices.Clone(requestPath), "pkg/llmsim/", vtcCode, fairnessCode+"fairness.go", fairnessCode+"fairreport.go")},
	{bench: "fairness-cluster", report: "fairness-cluster.md", command: "make bench-fairness-cluster",
		measures: append(slices.Clone(requestPath), "app/", "worker/", "pkg/llmsim/", vtcCode, "tests/multi/fairness_test.go", "tests/multi/stack_test.go")},
	{report: "chaos.md", command: "make chaos",
		measures: append(slices.Clone(requestPath), "app/", "worker/", "pkg/backend/", "pkg/limiter/", "tests/chaos/")},
}

// readFromRoot reads a file by its path from the root.
func readFromRoot(p string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
	return string(raw), err
}

// TestQuotedFiguresAppearInTheirReports: every number in a paragraph,
// list item or table row that links a bench report is in that report
// (the convention in docs/testing.md).
func TestQuotedFiguresAppearInTheirReports(t *testing.T) {
	stale := staleReports(t)
	checked := 0
	for _, file := range markdownFiles(t) {
		name, _ := filepath.Rel(root, file)
		name = filepath.ToSlash(name)
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range units(string(raw), filepath.Dir(name)) {
			if len(reportLinks(u.text, filepath.Dir(name)))+len(u.caption) > 0 {
				checked++
			}
		}
		for _, p := range checkQuotes(name, string(raw), reports{read: readFromRoot, stale: stale}) {
			t.Error(p)
		}
	}
	// The docs quote a dozen reports in many places: far fewer checked
	// units means the parser no longer sees the links.
	if checked < 30 {
		t.Errorf("only %d units link a report; the convention's parser no longer finds them", checked)
	}
}

// staleReports judges each report's freshness as TestReportsAreFresh
// does and returns, by report path, why it is stale. A report whose age
// git cannot tell counts as fresh here: TestReportsAreFresh says so.
func staleReports(t *testing.T) func(string) string {
	t.Helper()
	why := map[string]string{}
	for _, s := range scenarios {
		if s.report == "" {
			continue
		}
		name := reportDir + "/" + s.report
		text, err := readFromRoot(name)
		if err != nil {
			continue
		}
		if _, problem, err := freshness(root, name, text, s, maxCommitsBehind); err == nil && problem != "" {
			why[name] = problem
		}
	}
	return func(report string) string { return why[report] }
}

// TestBenchFiguresLinkAReport: a unit that names a bench and quotes a
// figure with a bench's unit links the report the figure comes from.
func TestBenchFiguresLinkAReport(t *testing.T) {
	benches := map[string]string{}
	for _, s := range scenarios {
		switch {
		case s.bench == "" || benches[s.bench] != "":
		case s.report == "":
			benches[s.bench] = "it writes none yet: run " + s.command + " and commit its report"
		default:
			benches[s.bench] = reportDir + "/" + s.report
		}
	}
	for _, file := range markdownFiles(t) {
		name, _ := filepath.Rel(root, file)
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range checkUnlinked(filepath.ToSlash(name), string(raw), benches) {
			t.Error(p)
		}
	}
}

// TestEveryReportHasAScenario: each report in tests/load/report/ has an
// entry above (so its measured paths are declared) and a run line; each
// entry's report and paths exist; every make target of a sluice-bench
// scenario is known, so that TestBenchFiguresLinkAReport sees its name.
func TestEveryReportHasAScenario(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, reportDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, s := range scenarios {
		if s.report == "" {
			continue
		}
		known[s.report] = true
		text, err := readFromRoot(reportDir + "/" + s.report)
		if err != nil {
			t.Errorf("scenario %s: %v", s.command, err)
			continue
		}
		if _, err := parseRun(text); err != nil {
			t.Errorf("%s/%s: %v", reportDir, s.report, err)
		}
		for _, p := range s.measures {
			if _, err := os.Stat(filepath.Join(root, p)); err != nil {
				t.Errorf("%s/%s measures %s, which does not exist", reportDir, s.report, p)
			}
		}
		if len(s.measures) == 0 {
			t.Errorf("%s/%s: no measured paths", reportDir, s.report)
		}
	}
	for _, f := range files {
		if !known[filepath.Base(f)] {
			t.Errorf("%s/%s has no entry in scenarios (tests/docs/figures_test.go): say what it measures", reportDir, filepath.Base(f))
		}
	}
	// The Makefile's bench targets, generated from sluice-bench's
	// scenario list.
	benchMK, err := readFromRoot("tests/load/bench.mk")
	if err != nil {
		t.Fatal(err)
	}
	targets := 0
	for _, m := range regexp.MustCompile(`(?m)^BENCH_(?:TARGETS|ALONE)\s*:=(.*)$`).FindAllStringSubmatch(benchMK, -1) {
		for _, target := range strings.Fields(m[1]) {
			targets++
			if !slices.ContainsFunc(scenarios, func(s scenario) bool { return s.command == "make "+target }) {
				t.Errorf("make %s has no entry in scenarios", target)
			}
		}
	}
	if targets == 0 {
		t.Error("tests/load/bench.mk: no BENCH_TARGETS or BENCH_ALONE line")
	}
}

// freshness checks a report (name, its text) of scenario s against
// repo's HEAD: how many commits on s's measured paths came after its run,
// and the problem when that is more than max ("" when it is not);
// errNoHistory when git cannot tell.
func freshness(repo, name, text string, s scenario, max int) (behind int, problem string, err error) {
	r, err := parseRun(text)
	if err != nil {
		return 0, name + ": " + err.Error(), nil
	}
	n, err := commitsSince(repo, r.rev, s.measures)
	switch {
	case errors.Is(err, errNoHistory):
		return 0, "", fmt.Errorf("%s: %w", name, err)
	case err != nil:
		return 0, fmt.Sprintf("%s: ran at %s: %v", name, r.rev, err), nil
	case n > max:
		return n, fmt.Sprintf("%s ran at %s (%s); %d commits since touch what it measures (%s), more than %d: re-run %s and commit the report and the docs quoting it",
			name, r.rev, r.date.Format(time.DateOnly), n, strings.Join(s.measures, " "), max, s.command), nil
	}
	return n, "", nil
}

// TestReportsAreFresh: no report ran more than maxCommitsBehind commits
// on its measured paths before HEAD. Skipped without git history (a
// shallow clone), unless SLUICE_TEST_FULL_CLONE is set, as .ci/run does:
// there the check must run.
func TestReportsAreFresh(t *testing.T) {
	var missing []string
	for _, s := range scenarios {
		if s.report == "" {
			continue
		}
		name := reportDir + "/" + s.report
		text, err := readFromRoot(name)
		if err != nil {
			continue // TestEveryReportHasAScenario says so
		}
		behind, problem, err := freshness(root, name, text, s, maxCommitsBehind)
		switch {
		case err != nil:
			missing = append(missing, err.Error())
		case problem != "":
			t.Error(problem)
		default:
			t.Logf("%s: %d commits on its measured paths since it ran", name, behind)
		}
	}
	if len(missing) > 0 {
		msg := "cannot count commits since the reports ran:\n" + strings.Join(missing, "\n")
		if os.Getenv("SLUICE_TEST_FULL_CLONE") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg + "\n(a full clone runs this check; CI sets SLUICE_TEST_FULL_CLONE)")
	}
}
