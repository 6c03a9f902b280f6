package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A figure checked against its report is only as good as the figures
// left unchecked: a unit that quotes a measurement and links no report
// is read by no test. So every unit of the README and docs/ that says a
// figure was measured, in a unit a bench measures in, either links the
// report it comes from or is named below with the reason it is not a
// bench figure.

var (
	// benchLooking is a figure in a unit a bench measures in: time, a
	// ratio, a share, a rate, or a count of what a request costs.
	benchLooking = regexp.MustCompile(`\d(?:[\d,.]*\d)?\s?(?:ms\b|µs|×|%|[a-z]*/s\b|actions\b|events\b|answers\b|min\b)`)
	// measuredWords say that a unit's figures were measured, or name
	// the runs that measure.
	measuredWords = regexp.MustCompile(`(?i)\bbench|measur|\bp50\b|\bp99\b|\bmedian\b|\bthis (?:2-core )?machine|\b(?:ran|run|runs)\b|sluice-bench|\bcosts?\b|\b(?:takes|took|gave|got|held|reached)\b|answers/s`)
)

// unreported is a unit that quotes measured-looking figures without a
// report: the file, a phrase of the unit, and why no report holds them.
type unreported struct{ file, phrase, why string }

// notBenchFigures is the allowlist: each entry's reason says what its
// figures are, if not a bench's.
var notBenchFigures = []unreported{
	// Settings, limits and thresholds: what the code is told, not what
	// a run measured.
	{"docs/alerts.md", "The healer treats a timeout rate above 5%", "the healer's threshold"},
	{"docs/api.md", "At most 8 answers per request", "the API's limit on n"},
	{"docs/operations.md", "157 buckets, 100 µs–10 min", "the histogram's range and error, by construction"},
	{"docs/operations.md", "**warn** (P99/P50 > 2", "the healer's thresholds"},
	{"docs/operations.md", "**critical** (P99/P50 > 5", "the healer's thresholds"},
	{"docs/operations.md", "**healthy** for", "the healer's thresholds"},
	{"docs/operations.md", "applies Sluice's capacity formula", "sluice-plan's example inputs"},
	{"docs/security.md", "| abuse bans (", "the ban's defaults"},
	{"docs/testing.md", "**Healing under mixed load**", "a test's settings and assertions"},
	{"docs/testing.md", "| TestFairSharesAcrossInstances |", "what the cluster test asserts (go test fails outside it)"},
	{"docs/testing.md", "| TestNoOverAdmissionAcrossInstances |", "the cluster test's sampling interval"},
	{"docs/traffic.md", "Shares are of **tokens**", "the fair queue's arithmetic"},
	{"docs/traffic.md", "every API instance picks it up within 500 ms", "the config reload interval"},
	{"docs/traffic.md", "While a request waits, its position is re-read", "the position poll's interval and the telling rule's settings"},
	{"docs/traffic.md", "A waiter asks when it queues. Finding no stream", "the Asker's interval and round size"},
	{"docs/traffic.md", "The\nSLO bench found the depth rule", "a former rule's outcome, described without a figure of a report"},
	{"docs/performance.md", "The plot ([tests/load/report/heal.png]", "make test's healing test's settings"},
	{"docs/performance.md", "Activity heartbeats (one per 80%", "the heartbeat's share of its timeout"},
	// Estimates: arithmetic on figures quoted (and checked) elsewhere.
	{"docs/performance.md", "With the default `events.ttl` of 1 h", "an estimate from the soak run's event streams"},
	{"docs/scaling.md", "Every Sluice process is stateless", "10× and 100× name the scales the page estimates"},
	{"docs/scaling.md", "A request costs Temporal 2 workflow tasks", "actions per request as performance.md derives them"},
	{"docs/scaling.md", "Rounding 1× up to 25 answers/s", "the estimate's scales"},
	{"docs/scaling.md", "The GPU rows are", "the estimate's scale"},
	{"docs/scaling.md", "What grows with a deployment", "an estimate from the event streams' size"},
	{"docs/scaling.md", "A kb takes about 5.6× its text", "the index's own arithmetic (knowledge-bases.md)"},
	{"docs/knowledge-bases.md", "A batch that shrinks", "the index's own arithmetic per embedding dimension"},
	{"docs/performance.md", "With the usage ledger on, its record", "what a recorded history (tests/histories) gives; the bench runs without the ledger"},
	// Recorded fixtures: checked-in files a reader can count.
	{"docs/encryption.md", "The recorded encrypted chat history", "sizes of recorded histories under tests/histories"},
	// Measured by a Go benchmark or a test, each shown with its command;
	// no bench report holds them, so the doc check cannot read them.
	{"docs/encryption.md", "Sealing and opening a 1 KiB payload", "a Go benchmark of the codec"},
	{"docs/knowledge-bases.md", "`TestMemoryEstimate` holds it within", "a test's bound and what it measured"},
	{"docs/knowledge-bases.md", "100k chunks is 18 ms p50", "a Go benchmark of the search"},
	{"docs/performance.md", "| building everything with a cold Go build cache |", "the first-run table, measured by hand on the date its caption gives"},
	{"docs/performance.md", "Where the time goes, and what was done", "the dev server's start call, timed while tuning"},
	{"docs/performance.md", "| kb / embedder | p50 on | p50 off |", "Go benchmarks of the cache tiers"},
	{"docs/performance.md", "An L2 hit is one round trip", "a CPU profile of a Go benchmark"},
	{"docs/performance.md", "one admission grant + release against the local", "Go benchmarks (make bench-go)"},
	{"docs/performance.md", "A goroutine dump of the API", "an investigation of the workflow cache, not a bench"},
	{"docs/performance.md", "(~70 s; local embedder", "the kb scale test"},
	{"docs/performance.md", "Exact search at 100k chunks is bound", "Go benchmarks of the search"},
	{"docs/redis-cluster.md", "Measured by `TestRedisFailoverUnderLoad`", "the cluster test's failovers"},
	{"docs/helm.md", "| first build of helm (cold module cache) |", "build times measured by hand with their commands"},
	{"docs/operations.md", "is **not a\nGrafana screenshot**", "how the dashboard preview was drawn"},
	{"docs/traffic.md", "A signal costs a server round trip", "an order of magnitude, not a run's figure"},
	{"docs/traffic.md", "Measured: `go test ./pkg/admission -run GroupShares -v`", "a unit test's shares, shown with its command"},
	// Earlier runs, each named by the commit whose report holds them.
	{"docs/performance.md", "The runs before it are in the", "earlier runs' reports, in git at the commits named"},
}

// uncheckedMeasured returns the units of a document that quote a
// bench-looking figure, say it was measured, and link no report.
func uncheckedMeasured(name, text string) []unit {
	var out []unit
	dir := docDir(name)
	for _, u := range units(text, dir) {
		if len(reportLinks(u.text, dir))+len(u.caption) > 0 {
			continue
		}
		// A row says what it measures in its table's header and caption.
		p := prose(u.text)
		if benchLooking.MatchString(p) && measuredWords.MatchString(p+"\n"+prose(u.table)) {
			out = append(out, u)
		}
	}
	return out
}

// oneLine is a text with its runs of white space one space, as a phrase
// of the allowlist is matched whatever the lines' breaks.
func oneLine(text string) string { return strings.Join(strings.Fields(text), " ") }

func docDir(name string) string { return filepath.ToSlash(filepath.Dir(name)) }

// TestEveryMeasuredFigureIsChecked: README.md and docs/*.md quote no
// measured figure that no report checks, but for the allowlist above;
// and every allowlist entry still names such a unit.
func TestEveryMeasuredFigureIsChecked(t *testing.T) {
	used := make([]bool, len(notBenchFigures))
	checked := 0
	for _, file := range markdownFiles(t) {
		name, _ := filepath.Rel(root, file)
		name = filepath.ToSlash(name)
		if name == "CHANGELOG.md" {
			continue // history: each entry's figures are of its release
		}
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range units(string(raw), docDir(name)) {
			if len(reportLinks(u.text, docDir(name)))+len(u.caption) > 0 {
				checked++
			}
		}
	next:
		for _, u := range uncheckedMeasured(name, string(raw)) {
			for i, a := range notBenchFigures {
				if a.file == name && strings.Contains(oneLine(u.text+"\n"+u.table), oneLine(a.phrase)) {
					used[i] = true
					continue next
				}
			}
			t.Errorf("%s:%d: quotes %q as measured and links no report: link the report it comes from, or say it is not a bench figure in notBenchFigures (tests/docs/coverage_test.go)",
				name, u.line, benchLooking.FindString(prose(u.text)))
		}
	}
	for i, a := range notBenchFigures {
		if !used[i] {
			t.Errorf("notBenchFigures: %s no longer has an unchecked unit with %q: drop the entry", a.file, a.phrase)
		}
	}
	t.Logf("%d units of README.md and docs/ quote a report and are checked against it; %d allowed unchecked", checked, len(notBenchFigures))
}

func TestUncheckedMeasuredFigureIsFound(t *testing.T) {
	doc := "Measured with `make bench-burst`: drained at 0.54×.\n\n" +
		"Measured with `make bench-burst`: drained at 0.54× ([report](../tests/load/report/burst.md)).\n\n" +
		"`max_wait` defaults to 500 ms.\n\n" +
		"The goodput run cost 6 actions a request.\n\n" +
		"Measured on this machine:\n\n| what | time |\n|---|---|\n| a query | 5 ms |\n\n" +
		"Defaults:\n\n| what | time |\n|---|---|\n| a poll | 500 ms |\n"
	var lines []int
	for _, u := range uncheckedMeasured("docs/perf.md", doc) {
		lines = append(lines, u.line)
	}
	// a table row is measured when its caption says so
	if !slices.Equal(lines, []int{1, 7, 13}) {
		t.Errorf("want the unlinked measurements on lines 1, 7 and 13, got %v", lines)
	}
}
