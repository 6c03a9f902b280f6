package heal

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
)

// fakeHealRun is a run whose short pool shows ratios[i] at second i+1,
// with the healer's poll count equal to the second.
func fakeHealRun(mode string, ratios ...float64) *healRun {
	r := &healRun{Mode: mode}
	for i, x := range ratios {
		st := latency.Stats{Count: 100, P50: 10 * time.Millisecond, P99: time.Duration(x * float64(10*time.Millisecond))}
		r.Samples = append(r.Samples, healSample{At: time.Duration(i+1) * time.Second, Pools: map[string]latency.Stats{"short": st}, Polls: int64(i + 1)})
	}
	return r
}

func TestHealVerdicts(t *testing.T) {
	o := healOptions{duration: 10 * time.Second, minSamples: 20, boundPolls: 3}
	off := fakeHealRun("off", 1, 1, 8, 9, 1.5, 8, 9, 9, 1.5, 9)
	on := fakeHealRun("on", 1, 1, 8, 9, 1.5, 1.4, 1.3, 1.2, 1.5, 1.4)
	met := func(v []report.Goal) (n int) {
		for _, g := range v {
			if g.Met {
				n++
			}
		}
		return n
	}
	// "on" ran first: it is still compared with "off".
	if v := healVerdicts(o, []*healRun{on, off}); len(v) != 3 || met(v) != 3 {
		t.Fatalf("verdicts %+v: want 3, all met", v)
	}
	// Below 2 three polls after first going above 5 (poll 3 → 5)...
	o.boundPolls = 1
	if v := healVerdicts(o, []*healRun{off, on}); met(v) != 2 {
		t.Fatalf("verdicts %+v: want the bound missed", v)
	}
	// ...and never above 5 at all is not healing.
	o.boundPolls = 30
	calm := fakeHealRun("on", 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
	if v := healVerdicts(o, []*healRun{off, calm}); met(v) != 2 {
		t.Fatalf("verdicts %+v: want 'never critical' missed", v)
	}
}

// The client verdicts compare healing on with off within the noise bound:
// a long pool whose clients wait twice as long with healing on fails, the
// same wait passes.
func TestHealClientVerdicts(t *testing.T) {
	run := func(mode string, longTTFT time.Duration) *healRun {
		r := &healRun{Mode: mode, Clients: newClientTallies()}
		for range 100 {
			r.Clients["short"].add(chat.Result{Kind: chat.KindDone, TTFT: 300 * time.Millisecond})
			r.Clients["long"].add(chat.Result{Kind: chat.KindDone, TTFT: longTTFT})
		}
		return r
	}
	verdict := func(runs ...*healRun) map[string]bool {
		out := map[string]bool{}
		for _, g := range clientVerdicts(runs) {
			out[g.What] = g.Met
		}
		return out
	}
	same := verdict(run("off", 3*time.Second), run("on", 3*time.Second))
	for what, met := range same {
		if !met {
			t.Errorf("same measures, %q missed", what)
		}
	}
	costly := verdict(run("off", 3*time.Second), run("on", 6*time.Second))
	if costly["clients: long pool TTFT p99, healing on vs off (what protecting the short pool costs)"] {
		t.Error("the long pool's clients waiting twice as long passed")
	}
}
