package fairness

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
)

// The report counts only what ended within the window, leaves cut
// requests out, splits the heavy tenants' tokens and judges the goals.
func TestPoolsReportCountsTheWindow(t *testing.T) {
	start := time.Now()
	run := &poolsRun{mode: "shared", winStart: start, winEnd: start.Add(time.Minute), results: map[string][]poolsResult{}, backlogged: map[string]int{}, simSeqs: 16, seenSim: 16}
	in := start.Add(time.Second)
	add := func(tenant, kind string, served int, ttft time.Duration, end time.Time) {
		run.add(tenant, poolsResult{Result: chat.Result{Kind: kind, Served: served, TTFT: ttft}, end: end, total: 2 * ttft})
	}
	add("long", chat.KindDone, 600, time.Second, in)
	add("long", chat.KindDone, 9999, time.Second, start.Add(-time.Second)) // warm-up: left out
	add("long", "rejected queue_timeout", 0, 0, in)
	add("short", chat.KindDone, 300, 100*time.Millisecond, in)
	add("short", chat.KindDone, 300, 100*time.Millisecond, in)
	add("short", chat.KindHang, 0, 0, in) // cut at the window's end
	add("probe", chat.KindDone, 100, 2*time.Second, in)
	long, short := run.summary("long"), run.summary("short")
	if long.ended != 2 || long.answers != 1 || long.timeouts != 1 || long.served != 600 {
		t.Fatalf("long %+v", long)
	}
	if short.ended != 2 || short.served != 600 {
		t.Fatalf("short %+v", short)
	}
	p := &poolsScenario{runs: []*poolsRun{run}}
	r := &report.Report{Name: "pools"}
	p.goals(r, run)
	text := strings.Join(r.Lines, "\n")
	for _, want := range []string{"50.0% / 50.0% (goal within 10 points) — met", "TTFT p99: 2000.0 ms (goal <= 1000.0 ms) — MISSED"} {
		if !strings.Contains(text, want) {
			t.Errorf("goals\n%s\nwant a line with %q", text, want)
		}
	}
}

// Utilisation is what the window added to decoding over what it added to
// held, per pool, read from a /metrics page; a pool that held nothing has
// none.
func TestPoolsPermitUtilisation(t *testing.T) {
	page := "# TYPE sluice_permit_held_seconds_total counter\n" +
		"sluice_permit_held_seconds_total{pool=\"short\"} 10\n" +
		"sluice_permit_held_seconds_total{pool=\"long\"} 4\n" +
		"# TYPE sluice_permit_decoding_seconds_total counter\n" +
		"sluice_permit_decoding_seconds_total{pool=\"short\"} 5\n" +
		"sluice_permit_decoding_seconds_total{pool=\"long\"} 1\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, page) }))
	defer srv.Close()
	start, err := readPermitSeconds(context.Background(), srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	end := map[string]permitSeconds{"short": {held: 30, decoding: 20}, "long": {held: 4, decoding: 1}}
	got := permitReading{pools: permitsAdded(start, end)}
	want := "long held no permit, short 75.0% (15.0 s decoding of 20.0 s held)"
	if line := got.line(); line != want {
		t.Fatalf("line %q, want %q", line, want)
	}
}
