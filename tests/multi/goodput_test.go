package multi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// The goodput comparison runs only with SLUICE_MULTI_GOODPUT=1 (`make
// bench-cluster`), which also gives the short pool goodputPermits permits
// so that Temporal, not the pool, bounds what is served.
const goodputPermits = 16

func goodputMode() bool { return os.Getenv("SLUICE_MULTI_GOODPUT") == "1" }

// TestGoodputClusterAgainstSingle drives the same closed loops — P and
// 4×P clients each sending its next request as its last ended, 16-token
// answers — through the cluster stack (two APIs, two workers, Temporal
// server on PostgreSQL, Redis Cluster) and through `make run`'s shape
// started beside it (the dev server on SQLite, one redis-server, one API
// process with its worker inside), one after the other in one run on
// the same simulators, and writes answers/s and TTFT for each to
// tests/load/report/cluster-goodput.md. It is a measurement, not a pass
// or fail check beyond every request ending.
func TestGoodputClusterAgainstSingle(t *testing.T) {
	if !goodputMode() {
		t.Skip("a benchmark: SLUICE_MULTI_GOODPUT=1 (make bench-cluster)")
	}
	start := time.Now()
	s := stackFor(t)
	single := s.launchSingle(t)
	const warmUp, window = 5 * time.Second, 20 * time.Second
	type row struct {
		system  string
		clients int
		m       goodput
	}
	var rows []row
	for _, clients := range []int{goodputPermits, 4 * goodputPermits} {
		for _, sys := range []struct {
			name string
			apis []*apiProc
		}{{"cluster stack (2 APIs, 2 workers)", s.apis[:]}, {"make run's shape (1 API with its worker)", []*apiProc{single}}} {
			m := s.measureGoodput(sys.apis, clients, warmUp, window)
			t.Logf("%s, %d clients: %s", sys.name, clients, m)
			rows = append(rows, row{sys.name, clients, m})
			if m.broken > 0 {
				t.Errorf("%s, %d clients: %d requests broke a promise", sys.name, clients, m.broken)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Goodput: the cluster stack against `make run`'s shape\n\n")
	fmt.Fprintf(&b, "`make bench-cluster` (`SLUICE_MULTI=1 SLUICE_MULTI_GOODPUT=1 go test -run TestGoodputClusterAgainstSingle -v ./tests/multi/`), %s, on one machine (%d CPUs): short pool %d permits, %d-token answers, closed loop, %s warm-up then %s measured, each system in turn on the same simulators.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), goodputPermits, goodputTokens, warmUp, window)
	b.WriteString(testenv.RunLine(start) + "\n\n")
	fmt.Fprintf(&b, "| system | clients | answers/s | TTFT p50 | TTFT p99 | other outcomes |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %.1f | %d ms | %d ms | %s |\n", r.system, r.clients, r.m.perSecond, r.m.p50.Milliseconds(), r.m.p99.Milliseconds(), r.m.other)
	}
	fmt.Fprintf(&b, "\nCPU milliseconds per answer, by process, over each window (from /proc; both stacks run at once, only the loaded one moves):\n\n| system | clients | CPU ms per answer |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %s |\n", r.system, r.clients, r.m.cpu)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "tests", "load", "report", "cluster-goodput.md")
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", out, b.String())
}

const goodputTokens = 16

// goodput is one closed-loop measurement.
type goodput struct {
	perSecond float64
	p50, p99  time.Duration
	// other tallies what did not end in an answer; broken counts
	// requests that were not OK.
	other  string
	broken int
	// cpu is each part's CPU per answer over the window.
	cpu string
}

func (g goodput) String() string {
	return fmt.Sprintf("%.1f answers/s, TTFT p50 %s p99 %s, other: %s; CPU ms per answer: %s", g.perSecond, g.p50.Round(time.Millisecond), g.p99.Round(time.Millisecond), g.other, g.cpu)
}

// measureGoodput runs clients in a closed loop through apis (in turn) and
// counts the answers that ended inside the window after the warm-up.
func (s *stack) measureGoodput(apis []*apiProc, clients int, warmUp, window time.Duration) goodput {
	from := time.Now().Add(warmUp)
	until := from.Add(window)
	var cpuFrom, cpuUntil map[string]float64
	cpuRead := make(chan struct{})
	go func() {
		defer close(cpuRead)
		time.Sleep(time.Until(from))
		cpuFrom = cpuByPart()
		time.Sleep(time.Until(until))
		cpuUntil = cpuByPart()
	}()
	load := chatclient.StartLoad(s.http, clients, func(c, n int) (string, string) {
		return apis[(c+n)%len(apis)].url, nextKey()
	}, chatclient.Request{MaxTokens: goodputTokens, Bound: time.Minute})
	time.Sleep(time.Until(until))
	all := load.Stop()
	var inWindow []*chatclient.Result
	for _, r := range all {
		if r.End().After(from) && r.End().Before(until) {
			inWindow = append(inWindow, r)
		}
	}
	var ttfts []time.Duration
	var other []*chatclient.Result
	for _, r := range inWindow {
		if r.Terminal == "done" {
			ttfts = append(ttfts, r.TTFT)
		} else {
			other = append(other, r)
		}
	}
	g := goodput{perSecond: float64(len(ttfts)) / window.Seconds(), other: "none"}
	if len(other) > 0 {
		g.other = chatclient.Tally(other)
	}
	for _, r := range all {
		if !r.OK() {
			g.broken++
		}
	}
	<-cpuRead
	g.cpu = cpuPerAnswer(cpuFrom, cpuUntil, len(ttfts))
	if len(ttfts) > 0 {
		slices.Sort(ttfts)
		g.p50, g.p99 = ttfts[len(ttfts)/2], ttfts[min(len(ttfts)-1, len(ttfts)*99/100)]
	}
	return g
}

// launchSingle starts `make run`'s shape beside the cluster stack, on the
// same simulators: the dev server on SQLite, one redis-server, one API
// process with the worker inside it and eager workflow start.
func (s *stack) launchSingle(t *testing.T) *apiProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	tlog, err := os.Create(filepath.Join(dir, "temporal.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tlog.Close() })
	dev, err := testenv.LaunchPersistentTemporal(ctx, workflows.SearchAttributeNames, dir, tlog)
	if err != nil {
		t.Fatalf("start the dev server: %v", err)
	}
	t.Cleanup(func() { _ = dev.Stop() })
	rds := testenv.StartRedis(t)
	cfg := s.cfg
	cfg.Redis.Addrs, cfg.Redis.Addr = nil, rds.Addr
	cfg.Temporal.HostPort = dev.HostPort
	cfg.API.EmbeddedWorker, cfg.Temporal.EagerStart = true, true
	if cfg.API.Addr, err = freeAddr(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	proc, err := testenv.NewProcess(dir, "single-api", filepath.Join(root, "bin", "sluice-api"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProc{Process: proc, url: "http://" + cfg.API.Addr}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	if err := s.waitAnswered(ctx, p); err != nil {
		t.Fatalf("the single stack: %v", err)
	}
	return p
}
