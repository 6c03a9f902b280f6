package multi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/tests/load/vtc"
	"github.com/sluice-dev/sluice/tests/settle"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// The VTC fairness replay through the cluster stack runs only with
// SLUICE_MULTI_FAIRNESS=1 (`make bench-fairness-cluster`), which sizes
// the simulators and gives every client of the workload a tenant before
// the stack starts. SLUICE_FAIRNESS_DURATION replays the trace's first
// that many seconds (60: a smoke run); SLUICE_FAIRNESS_WORKLOAD picks
// the workload (real, the default, or overload).
func fairnessMode() bool { return os.Getenv("SLUICE_MULTI_FAIRNESS") == "1" }

// theFairness is the prepared replay in fairness mode, else nil.
var theFairness *fairnessBench

// fairnessBench is the workload prepared for the cluster stack: the same
// options, simulator sizing and Sluice settings as sluice-bench
// fairness's defaults (4× faster than recorded, the recorded max_tokens,
// the pools' default permits sharing the simulator's 16 sequences).
type fairnessBench struct {
	opts vtc.Options
	run  *vtc.Run
	// env is what the run was asked for, for the report's command.
	env string
}

func prepareFairness() (*fairnessBench, error) {
	f := &fairnessBench{opts: vtc.DefaultOptions()}
	name := "real"
	if v := os.Getenv("SLUICE_FAIRNESS_WORKLOAD"); v != "" {
		name = v
		f.env += " SLUICE_FAIRNESS_WORKLOAD=" + v
	}
	w, ok := vtc.Workloads[name]
	if !ok {
		return nil, fmt.Errorf("SLUICE_FAIRNESS_WORKLOAD: unknown workload %q (real, overload)", name)
	}
	if v := os.Getenv("SLUICE_FAIRNESS_DURATION"); v != "" {
		d, err := strconv.ParseFloat(v, 64)
		if err != nil || !(d > vtc.PaperSpec.Warmup) || d > vtc.PaperSpec.Span {
			return nil, fmt.Errorf("SLUICE_FAIRNESS_DURATION: %q is not a number of trace seconds above %v and at most %v", v, vtc.PaperSpec.Warmup, vtc.PaperSpec.Span)
		}
		f.opts.Duration = d
		f.env += " SLUICE_FAIRNESS_DURATION=" + v
	}
	if err := f.opts.Validate(); err != nil {
		return nil, err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	writer, err := vtc.NewPromptWriter(tokens.CL100K)
	if err != nil {
		return nil, err
	}
	if f.run, err = vtc.Prepare(w, filepath.Join(root, vtc.DefaultDir), f.opts, writer); err != nil {
		return nil, fmt.Errorf("%w (the VTC workloads live in %s beside the checkout)", err, vtc.DefaultDir)
	}
	return f, nil
}

func (f *fairnessBench) launchOptions() launchOptions {
	return launchOptions{
		simulator: func(sim *llmsim.Config) { f.run.Sizing.Apply(sim, f.opts.Speed) },
		configure: f.configure,
	}
}

// configure turns multiConfig into the fairness bench's Sluice: both
// pools on the first simulator alone (the paper's one server), the
// pools' deadlines, the admission lease and the LLM timeouts back at
// their defaults (multiConfig cuts them short for the fault tests; a
// replay waits minutes), no abuse bans (one key a client sends hundreds
// of requests), then vtc's settings: a tenant per client, waits as long
// as the replay.
func (f *fairnessBench) configure(cfg *config.Config) {
	d := config.Default()
	for _, p := range []struct {
		pool *config.Pool
		def  config.Pool
	}{{&cfg.Pools.Short, d.Pools.Short}, {&cfg.Pools.Long, d.Pools.Long}} {
		sim := p.pool.Endpoints[0]
		*p.pool = p.def
		p.pool.Endpoints = []string{sim}
	}
	cfg.LLM = d.LLM
	cfg.Admission = d.Admission
	cfg.API.DisconnectGrace, cfg.API.QueuePollInterval = d.API.DisconnectGrace, d.API.QueuePollInterval
	cfg.Limits.Ban.Enabled = false
	f.run.Configure(cfg, f.opts)
}

// TestFairnessClusterVTC replays the VTC paper's real workload (its
// recorded max_tokens) as sluice-bench fairness does, first straight to
// the simulator (FCFS), then through the cluster stack: row i through
// API i mod 2, so that every client's requests go through both APIs and
// both workers, each client a tenant at equal weight on one fair queue
// in the Redis Cluster. It writes the paper's rows for both to
// tests/load/report/fairness-cluster.md. It is a measurement, not a
// pass or fail check beyond every request ending as the replay allows
// (answered, or cut at the end) and nothing left held afterwards.
func TestFairnessClusterVTC(t *testing.T) {
	if theFairness == nil {
		t.Skip("a benchmark: SLUICE_MULTI_FAIRNESS=1 (make bench-fairness-cluster)")
	}
	s := stackFor(t)
	f, run := theFairness, theFairness.run
	start, startLoad := time.Now(), testenv.LoadAverage()
	ctx := context.Background()
	simURL := s.cfg.Pools.Short.Endpoints[0]

	fcfs, err := f.replay(ctx, t, vtc.SimulatorTarget(simURL))
	if err != nil {
		t.Fatal(err)
	}
	vtc.WaitSimulatorIdle(s.sims[0], time.Minute)
	run.Systems = append(run.Systems, fcfs)

	cpuFrom := cpuByPart()
	sl, err := f.replay(ctx, t, run.SluiceTarget(s.apis[0].url, s.apis[1].url))
	if err != nil {
		t.Fatal(err)
	}
	cpu := cpuPerAnswer(clusterParts(cpuFrom), clusterParts(cpuByPart()), countDone(sl))
	sl.Label = "Sluice, 2 APIs and 2 workers (this run)"
	idleFrom := time.Now()
	if err := settle.PoolsIdle(ctx, s.gate, time.Minute); err != nil {
		t.Errorf("after the replay through the cluster stack: %v", err)
	} else {
		sl.IdleAfter = time.Since(idleFrom)
	}
	for _, pool := range s.gate.Pools() {
		qs, err := s.gate.QueueStats(ctx, pool)
		if err != nil {
			t.Fatalf("read pool %s: %v", pool, err)
		}
		sl.Final = append(sl.Final, vtc.PoolState{Pool: pool, InUse: qs.InUse, Waiting: qs.Waiting})
	}
	if n, err := settle.RunningChats(ctx, s.tc, s.cfg.Temporal.Namespace, time.Minute); err != nil || n > 0 {
		t.Errorf("after the replay through the cluster stack: %d chat workflows still running (%v)", n, err)
	}
	vtc.WaitSimulatorIdle(s.sims[0], time.Minute)
	run.Systems = append(run.Systems, sl)
	for i, o := range sl.Outcomes {
		if o.Kind != vtc.Done && o.Kind != vtc.Cut {
			t.Errorf("row %d (client %s, arrival %.1f s) through %s: %s", i, run.Rows[i].Client, run.Rows[i].Arrival, s.apis[i%2].Name, o.Kind)
		}
	}

	report := f.report(start, startLoad, s.cfg, cpu)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "tests", "load", "report", "fairness-cluster.md")
	if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", out, report)
}

// replay replays the run against target, logging its progress every 30
// seconds and its result at the end.
func (f *fairnessBench) replay(ctx context.Context, t *testing.T, target vtc.Target) (*vtc.System, error) {
	done := make(chan struct{})
	defer close(done)
	fs, err := f.run.Replay(ctx, target, f.opts, func(rp *vtc.Replay) {
		go func() {
			tick := time.NewTicker(30 * time.Second)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					t.Logf("%s", rp.Status())
				}
			}
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("replay to %s: %w", target.System, err)
	}
	t.Logf("%s: %s", fs.Label, fs.Summary())
	return fs, nil
}

// clusterParts leaves out of cpuByPart's reading the parts that are not
// the cluster stack's: no single stack runs beside it here, so a dev
// server or a lone redis-server is another job's on a shared machine.
func clusterParts(parts map[string]float64) map[string]float64 {
	delete(parts, "Temporal dev server (SQLite)")
	delete(parts, "redis-server")
	return parts
}

func countDone(fs *vtc.System) int {
	n := 0
	for _, o := range fs.Outcomes {
		if o.Kind == vtc.Done {
			n++
		}
	}
	return n
}

// report is the report's text: sluice-bench fairness's layout (a fenced
// block of the same header lines and sections), so that the two reports
// read side by side.
func (f *fairnessBench) report(start time.Time, startLoad string, cfg config.Config, cpu string) string {
	o := f.opts
	var sh lineSheet
	sh.Linef("fairness-cluster: the VTC paper's %s workload replayed at its arrival times %g× faster than recorded, each row one streamed "+
		"OpenAI chat completion with a prompt of its recorded length and max_tokens = the recorded output length, each client a tenant of its own at equal weight; "+
		"first straight to the simulator (its FIFO of sequences: FCFS), then through the cluster stack's two sluice-api processes (row i through API i mod 2: "+
		"every client's requests through both), two sluice-worker processes, the Temporal server on PostgreSQL and a Redis Cluster of three masters, "+
		"on one simulator sized as sluice-bench fairness sizes it; %g trace seconds replayed, open streams cut %g s after; every time in trace seconds",
		f.run.Workload.Name, o.Speed, o.Duration, o.Drain)
	sh.Linef("command: make bench-fairness-cluster (SLUICE_MULTI=1 SLUICE_MULTI_FAIRNESS=1%s go test -run TestFairnessClusterVTC -v ./tests/multi/)", f.env)
	sh.Linef("%s", testenv.RunLine(start))
	sh.Linef("machine: %d CPUs; load average %s at the start, %s at the end", runtime.NumCPU(), startLoad, testenv.LoadAverage())
	if o.Duration < vtc.PaperSpec.Span {
		sh.Linef("a smoke run: %g of the trace's %g seconds; the paper's figures are over all of it", o.Duration, vtc.PaperSpec.Span)
	}
	sh.Linef("")
	vtc.WriteRun(&sh, f.run, o, cfg)
	sh.Linef("CPU milliseconds per answer through the cluster stack, by process, over the replay (from /proc, by process name: on a shared machine another job's processes of the same names count too): %s", cpu)
	vtc.WriteGoals(&sh, []*vtc.Run{f.run}, o)
	return "# Token fairness against VTC through the cluster stack\n\n```\n" + strings.Join(sh, "\n") + "\n```\n"
}

// lineSheet is a report as lines of text, its tables as markdown rows
// (sluice-bench's report layout).
type lineSheet []string

func (sh *lineSheet) Linef(format string, args ...any) {
	*sh = append(*sh, fmt.Sprintf(format, args...))
}

func (sh *lineSheet) Table(columns ...string) {
	sh.Row(columns...)
	*sh = append(*sh, "|"+strings.Repeat("---|", len(columns)))
}

func (sh *lineSheet) Row(cells ...string) {
	var b strings.Builder
	b.WriteString("|")
	for _, c := range cells {
		if c != "" {
			b.WriteString(" " + c)
		}
		b.WriteString(" |")
	}
	*sh = append(*sh, b.String())
}

func (sh *lineSheet) Goal(what, measured, want string, met bool) {
	*sh = append(*sh, vtc.GoalLine(what, measured, want, met))
}

// The fairness bench's configuration (checked without the stack): both
// pools on the first simulator alone, with make run's deadlines rather
// than the fault tests' short ones, a tenant per client, and valid.
func TestFairnessBenchConfig(t *testing.T) {
	t.Setenv("SLUICE_FAIRNESS_DURATION", "60")
	f, err := prepareFairness()
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	cfg := multiConfig([]string{"127.0.0.1:7000"}, "127.0.0.1:7233", []string{"http://127.0.0.1:1", "http://127.0.0.1:2"})
	f.launchOptions().configure(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d := config.Default()
	for _, p := range []struct{ got, def config.Pool }{{cfg.Pools.Short, d.Pools.Short}, {cfg.Pools.Long, d.Pools.Long}} {
		if len(p.got.Endpoints) != 1 || p.got.Endpoints[0] != "http://127.0.0.1:1" {
			t.Errorf("pool endpoints %v, want the first simulator alone", p.got.Endpoints)
		}
		if p.got.FirstTokenTimeout != p.def.FirstTokenTimeout || p.got.MaxWait != p.def.MaxWait || p.got.Breaker != p.def.Breaker {
			t.Errorf("pool deadlines %v/%v, want the defaults %v/%v", p.got.FirstTokenTimeout, p.got.MaxWait, p.def.FirstTokenTimeout, p.def.MaxWait)
		}
	}
	if cfg.Pools.SharedLimit() != f.opts.Batch || cfg.Limits.Ban.Enabled || cfg.Admission.Lease != d.Admission.Lease {
		t.Errorf("shared permits %d (want %d), bans %v, lease %v", cfg.Pools.SharedLimit(), f.opts.Batch, cfg.Limits.Ban.Enabled, cfg.Admission.Lease)
	}
	if n := len(f.run.Keys); n == 0 || len(f.run.Rows) == 0 || f.run.Rows[len(f.run.Rows)-1].Arrival >= 60 {
		t.Errorf("%d clients, %d rows for the first 60 s", n, len(f.run.Rows))
	}
}
