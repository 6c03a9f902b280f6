//go:build !race

// The race detector slows every goroutine several times over, which is
// noise in a test whose measure is latency: make test runs this file in a
// second, race-free go test after the race-enabled one.

package heal

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
)

// healTestArgs are bench-heal's scenario at half time scale with half
// the simulator's capacity (the same load per slot), and a healer polling
// every second: two minutes for both modes instead of five.
var healTestArgs = []string{
	"-time-scale", "0.5", "-rate", "5", "-max-num-seqs", "11", "-short-permits", "16", "-long-permits", "4",
	"-duration", "60s", "-interval", "1s", "-window", "5s", "-min-samples", "20", "-healthy-polls", "10",
	"-sample-every", "2s", "-sample-window", "5s", "-bound-polls", "20",
	// The short pool's clients are promised 200 ms, which its tail makes
	// them miss (their TTFT P99 is ~0.55 s here): the healer must act.
	// Under the default promise of 1 s they are served and it holds.
	"-short-ttft-slo", "200ms",
	// The test asserts the mechanism: the healer acts and the tail falls.
	// What clients get is bench-heal's verdict.
	"-judge", "stages",
}

// TestHealingUnderMixedLoad runs the 80/20 mixed load against the
// simulator twice on fresh stacks (a real dev server, redis-server, the
// API with its worker): with healing off the short pool's P99/P50 stays
// above 5 in at least a quarter of the second half's samples; with healing
// on it goes above 5, then falls below 2 within 20 polls, and spends less
// of the second half above 5 than without. The figures are logged.
func TestHealingUnderMixedLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("two minutes of load on a dev server")
	}
	fs := flag.NewFlagSet("heal", flag.ContinueOnError)
	run := scenario.Bind("heal", &healScenario{}, fs)
	out := t.TempDir()
	if err := fs.Parse(append(healTestArgs, "-out", out)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	err := run(ctx)
	if md, rerr := os.ReadFile(filepath.Join(out, "heal.md")); rerr == nil {
		t.Logf("report:\n%s", md)
	}
	if err != nil {
		t.Fatal(err)
	}
}
