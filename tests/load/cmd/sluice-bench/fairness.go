package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// The fairness benchmark measures Sluice's token fairness against the
// VTC paper's (Sheng et al., "Fairness in Serving Large Language
// Models", OSDI 2024). Each of the paper's workloads is replayed at its
// arrival times, every client a tenant of its own at equal weight,
// first straight to the simulator (whose FIFO of sequences is FCFS, the
// paper's baseline), then through Sluice's OpenAI endpoint, on one
// simulator sized so that the offered load is the multiple of its
// capacity it was of the paper's server. The paper's metrics
// (fairmetrics.go) are computed from the times the client saw, in trace
// seconds; a speed factor compresses the trace and the simulator alike.

type fairnessOptions struct {
	workloads, dir, systems, maxTokensMode string
	// speed compresses the trace: arrivals and the simulator run speed
	// times faster than recorded; every figure is in trace time.
	speed float64
	// duration is the part of the trace replayed (trace seconds); drain
	// how long after it open streams may finish before they are cut.
	duration, drain float64
	// outputWeight is admission.output_token_weight.
	outputWeight          float64
	shortPerms, longPerms int
	// batch is the simulator's sequences (0: both pools' permits).
	batch int
	// onePool routes every request to the short pool, with a permit per
	// sequence of the simulator: fairness without the split into pools.
	onePool bool
	// requestsCSV, if set, gets every request's times.
	requestsCSV string
	// queuePerPermit is api.queue_per_permit.
	queuePerPermit float64
}

// defaultWorkloadDir holds the workloads, relative to the repository
// (a checkout beside the shared directory, as /work/main is).
const defaultWorkloadDir = "../shared/workloads"

// Systems a fairness run replays against.
const (
	sysFCFS = "fcfs"
	// sysSluice ("sluice") is goodput.go's.
)

// Output bounds a row may send.
const (
	maxTokensRecorded = "recorded"
	maxTokens1024     = "1024"
)

func (s *fairnessScenario) flags(fs *flag.FlagSet) {
	d := config.Default()
	fs.StringVar(&s.workloads, "workloads", "overload,real", "workloads to replay, in order (overload, real)")
	fs.StringVar(&s.dir, "dir", defaultWorkloadDir, "directory of vtc-overload.csv and vtc-real.csv")
	fs.StringVar(&s.systems, "systems", sysFCFS+","+sysSluice, "systems to replay each workload against, in order: fcfs (straight to the simulator), sluice")
	fs.StringVar(&s.maxTokensMode, "max-tokens-mode", maxTokensRecorded, "max_tokens of each request: recorded (its recorded output length) or 1024 (the answer is still its recorded length, by the simulator's answer-length directive)")
	fs.Float64Var(&s.speed, "speed", 4, "run the trace and the simulator this many times faster than recorded")
	fs.Float64Var(&s.duration, "duration", 600, "replay the trace's first this many seconds (the metrics' span; 600 is all of it)")
	fs.Float64Var(&s.drain, "drain", 60, "trace seconds after -duration that open streams may finish before they are cut")
	fs.Float64Var(&s.outputWeight, "output-weight", 2, "admission.output_token_weight: 2 charges prompt + 2 × max_tokens, the paper's cost of a request")
	fs.IntVar(&s.shortPerms, "short-permits", d.Pools.Short.MaxConcurrency, "permits of the short pool")
	fs.IntVar(&s.longPerms, "long-permits", d.Pools.Long.MaxConcurrency, "permits of the long pool (prompts over routing.short_threshold_tokens)")
	fs.IntVar(&s.batch, "batch", 0, "sequences the simulator runs at once, and the budget the two pools share on it (pools.shared.max_concurrency; 0: the larger pool's permits, as make run's)")
	fs.StringVar(&s.requestsCSV, "requests", "", "also write every request (client, arrival, first and last token, tokens, outcome) to this CSV")
	fs.Float64Var(&s.queuePerPermit, "queue-per-permit", d.API.QueuePerPermit, "api.queue_per_permit: requests per permit a pool's admission queue holds before the rest wait at the door")
	fs.BoolVar(&s.onePool, "one-pool", false, "route every request to the short pool (its prompt limit and the routing threshold raised to the long pool's), with -batch permits: one fair queue for the backend")
}

// fairnessScenario is the fairness benchmark: its flags, and a run per
// workload, each on a stack of its own (the simulator is sized to it).
type fairnessScenario struct {
	fairnessOptions
	systemList []string
	writer     *promptWriter
	runs       []*fairRun
	next       int
	cfg        config.Config
	// For the progress line.
	cur     atomic.Pointer[replay]
	curLoad atomic.Pointer[string]
}

// fairRun is one workload's replays.
type fairRun struct {
	workload fairWorkload
	rows     []fairRow
	sizing   simSizing
	spec     fairSpec
	keys     map[string]config.APIKey
	// bodies are the rows' requests; simPrompt the prompt tokens the
	// simulator counts of each, sluicePrompt those Sluice counts (the
	// directive included), which route it.
	bodies                  [][]byte
	simPrompt, sluicePrompt []int
	systems                 []*fairSystem
}

// fairSystem is one replay of a workload and what it measured.
type fairSystem struct {
	name     string
	outcomes []replayOutcome
	reqs     []fairReq
	result   fairResult
	took     time.Duration
	// Sluice only: the pools after the replay, and how long they took to
	// be idle (-1: not within a minute).
	final     []poolState
	idleAfter time.Duration
}

func (s *fairnessScenario) stacks() ([]stackOptions, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	var err error
	if s.writer, err = newPromptWriter(tokens.CL100K); err != nil {
		return nil, err
	}
	var out []stackOptions
	for _, name := range strings.Split(s.workloads, ",") {
		w, ok := fairWorkloads[strings.TrimSpace(name)]
		if !ok {
			return nil, fmt.Errorf("-workloads: unknown workload %q (overload, real)", name)
		}
		run, err := s.prepare(w)
		if err != nil {
			return nil, err
		}
		s.runs = append(s.runs, run)
		out = append(out, stackOptions{
			Quiet:     true,
			Simulator: func(sim *llmsim.Config) { run.sizing.apply(sim, s.speed) },
			Configure: func(cfg *config.Config) { s.configure(cfg, run) },
		})
	}
	return out, nil
}

func (s *fairnessScenario) validate() error {
	for _, sys := range strings.Split(s.systems, ",") {
		if sys != sysFCFS && sys != sysSluice {
			return fmt.Errorf("-systems: %q is neither %s nor %s", sys, sysFCFS, sysSluice)
		}
		s.systemList = append(s.systemList, sys)
	}
	switch {
	case s.maxTokensMode != maxTokensRecorded && s.maxTokensMode != maxTokens1024:
		return fmt.Errorf("-max-tokens-mode: %q is neither %s nor %s", s.maxTokensMode, maxTokensRecorded, maxTokens1024)
	case !(s.speed > 0) || !(s.duration > paperSpec.warmup) || s.drain < 0:
		return fmt.Errorf("-speed must be positive, -duration above %v s and -drain not negative", paperSpec.warmup)
	case !(s.queuePerPermit >= 0):
		return errors.New("-queue-per-permit must not be negative")
	case s.shortPerms < 1 || s.longPerms < 1 || s.batch < 0:
		return errors.New("-short-permits and -long-permits must be positive, -batch not negative")
	}
	if s.batch == 0 {
		s.batch = max(s.shortPerms, s.longPerms)
	}
	if s.shortPerms > s.batch || s.longPerms > s.batch {
		return fmt.Errorf("-short-permits %d and -long-permits %d must not exceed -batch %d: the pools share the simulator's sequences", s.shortPerms, s.longPerms, s.batch)
	}
	return nil
}

// prepare reads a workload, sizes its simulator and writes its requests.
func (s *fairnessScenario) prepare(w fairWorkload) (*fairRun, error) {
	all, err := loadWorkload(workloadPath(s.dir, w))
	if err != nil {
		return nil, fmt.Errorf("%w (-dir names the directory of the VTC workloads)", err)
	}
	run := &fairRun{workload: w, keys: map[string]config.APIKey{}}
	for _, r := range all {
		if r.arrival < s.duration {
			run.rows = append(run.rows, r)
		}
	}
	// The capacity is sized on the whole trace, so that a shorter replay
	// runs on the same simulator as a whole one.
	run.sizing = sizeSimulator(all, s.batch, w.paper[0].throughput)
	run.spec = paperSpec
	run.spec.span = s.duration
	keys := tenantKeys(fairTier, len(traceClients(toReqs(run.rows))))
	for i, c := range traceClients(toReqs(run.rows)) {
		run.keys[c] = keys[i]
	}
	model := config.Default().Pools.Short.Model
	for _, r := range run.rows {
		msg, simCount := s.writer.message(r)
		maxTokens := r.output
		if s.maxTokensMode == maxTokens1024 {
			maxTokens = 1024
		}
		run.bodies = append(run.bodies, chatBody(model, msg, maxTokens))
		run.simPrompt = append(run.simPrompt, simCount)
		run.sluicePrompt = append(run.sluicePrompt, s.writer.counter.CountChat([]tokens.Message{{Role: "user", Content: msg}}))
	}
	return run, nil
}

func toReqs(rows []fairRow) []fairReq {
	out := make([]fairReq, len(rows))
	for i, r := range rows {
		out[i] = fairReq{client: r.client}
	}
	return out
}

// fairTier is the clients' tier: the standard tier's weight, for all.
const fairTier = "fair"

// configure gives every client a tenant of its own at equal weight and
// lets a request wait as long as the replay lasts, as the paper's
// server queue does: no rate limits, no queue caps but the pools', no
// healer changing the permits, connections for every request at once.
func (s *fairnessScenario) configure(cfg *config.Config, run *fairRun) {
	keys := make([]config.APIKey, 0, len(run.keys))
	for _, c := range traceClients(toReqs(run.rows)) {
		keys = append(keys, run.keys[c])
	}
	addOpenTenants(cfg, fairTier, keys)
	wait := time.Duration((s.duration+s.drain)/s.speed*float64(time.Second)) + 10*time.Minute
	tier := cfg.Limits.Tiers[fairTier]
	tier.MaxWait, tier.MaxQueuePerTenant = wait, 0
	cfg.Limits.Tiers[fairTier] = tier
	cfg.Admission.MaxWait = wait
	cfg.Admission.OutputTokenWeight = s.outputWeight
	cfg.Healing.Enabled = false
	cfg.API.QueuePerPermit = s.queuePerPermit
	cfg.Pools.Short.MaxConcurrency, cfg.Pools.Long.MaxConcurrency = s.shortPerms, s.longPerms
	// Both pools name the one simulator: they share its sequences.
	cfg.Pools.Shared.MaxConcurrency = s.batch
	if s.onePool {
		cfg.Pools.Short.MaxConcurrency = s.batch
		cfg.Pools.Short.MaxPromptTokens = cfg.Pools.Long.MaxPromptTokens
		cfg.Routing.ShortThresholdTokens = cfg.Pools.Long.MaxPromptTokens
	}
	// Every answer ends at its recorded length; a notice after one cut
	// by max_tokens would be a token the backend did not produce.
	cfg.LLM.TruncationNotice = ""
	conns := len(run.rows) + 64
	cfg.API.MaxConnsPerIP, cfg.API.MaxConns = conns, max(cfg.API.MaxConns, conns)
	cfg.API.WaitingRoom = max(cfg.API.WaitingRoom, len(run.rows))
	cfg.Admission.MaxQueueDepth = max(cfg.Admission.MaxQueueDepth, len(run.rows))
}

func (s *fairnessScenario) drive(ctx context.Context, st *stack) error {
	run := s.runs[s.next]
	s.next++
	s.cfg = st.cfg
	name := run.workload.name
	s.curLoad.Store(&name)
	for _, sys := range s.systemList {
		fs, err := s.replaySystem(ctx, st, run, sys)
		if err != nil {
			return err
		}
		run.systems = append(run.systems, fs)
		fmt.Fprintf(os.Stderr, "%s fairness %s %s: %s\n", time.Now().Format("15:04:05"), name, sys, fs.summary())
	}
	return nil
}

// replaySystem replays the run's rows against one system and waits until
// the simulator (and Sluice's pools) are idle again.
func (s *fairnessScenario) replaySystem(ctx context.Context, st *stack, run *fairRun, sys string) (*fairSystem, error) {
	tr := &http.Transport{MaxIdleConns: len(run.rows), MaxIdleConnsPerHost: len(run.rows), IdleConnTimeout: time.Minute, DisableCompression: true}
	defer tr.CloseIdleConnections()
	target := replayTarget{system: sys, url: st.simURL + "/v1/chat/completions", hc: &http.Client{Transport: tr}}
	if sys == sysSluice {
		target.url = st.baseURL + "/v1/chat/completions"
		target.headers = func(r fairRow) map[string]string {
			return map[string]string{"Authorization": "Bearer " + run.keys[r.client].Key}
		}
	}
	rp := &replay{target: target, rows: run.rows, bodies: run.bodies, speed: s.speed, until: s.duration + s.drain}
	rp.begin()
	s.cur.Store(rp)
	rp.run(ctx)
	s.cur.Store(nil)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fs := &fairSystem{name: sys, outcomes: rp.outcomes, took: time.Since(rp.t0), idleAfter: -1}
	fs.reqs = rp.fairReqs(run.simPrompt)
	fs.result = measureFairness(fs.reqs, run.spec)
	if sys == sysSluice {
		var err error
		if fs.final, fs.idleAfter, err = waitIdle(ctx, st.rt.Gate, time.Minute); err != nil {
			return nil, err
		}
	}
	// The cut requests leave the simulator at its next step.
	for t0 := time.Now(); time.Since(t0) < time.Minute; time.Sleep(100 * time.Millisecond) {
		if sim := st.sim.Stats(); sim.Running+sim.Waiting == 0 {
			break
		}
	}
	return fs, nil
}

func (s *fairnessScenario) status(st *stack) string {
	rp := s.cur.Load()
	if rp == nil {
		return "phase=between-replays"
	}
	sim := st.sim.Stats()
	line := fmt.Sprintf("workload=%s %s sim_running=%d sim_waiting=%d", *s.curLoad.Load(), rp.status(), sim.Running, sim.Waiting)
	if rp.target.system == sysSluice {
		line += " " + poolsNow(st)
	}
	return line
}

// summary is a system's one-line result, for stderr as it ends.
func (fs *fairSystem) summary() string {
	r := fs.result
	last := 0.0
	if len(r.accDiff) > 0 {
		last = r.accDiff[len(r.accDiff)-1]
	}
	return fmt.Sprintf("accumulated difference %.0f, Max Diff %.1f, Avg Diff %.1f, throughput %.0f tok/s; %s", last, r.maxDiff, r.avgDiff, r.throughput, fs.outcomeCounts())
}
