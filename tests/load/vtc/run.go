package vtc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Options shape a replay of a workload, on either stack.
type Options struct {
	// MaxTokensMode is the output bound a row sends: MaxTokensRecorded,
	// MaxTokens1024 or MaxTokensOmitted.
	MaxTokensMode string
	// Speed compresses the trace: arrivals and the simulator run Speed
	// times faster than recorded; every figure is in trace time.
	Speed float64
	// Duration is the part of the trace replayed (trace seconds); Drain
	// how long after it open streams may finish before they are cut.
	Duration, Drain float64
	// OutputWeight is admission.output_token_weight.
	OutputWeight          float64
	ShortPerms, LongPerms int
	// Batch is the simulator's sequences (0: both pools' permits).
	Batch int
	// OnePool routes every request to the short pool, with a permit per
	// sequence of the simulator: fairness without the split into pools.
	OnePool bool
	// QueuePerPermit is api.queue_per_permit.
	QueuePerPermit float64
}

// Output bounds a row may send.
const (
	MaxTokensRecorded = "recorded"
	MaxTokens1024     = "1024"
	// MaxTokensOmitted sends no max_tokens: Sluice's api.default_max_tokens
	// and the simulator's default budget are raised to OmittedBudget, so
	// that neither cuts an answer short of its recorded length.
	MaxTokensOmitted = "omitted"
)

// OmittedBudget is the output budget of a request that names no
// max_tokens, on both stacks, in MaxTokensOmitted: above the longest
// recorded answer of the workloads (977 tokens).
const OmittedBudget = 1024

// LengthKnown reports whether Sluice knows each answer's length before
// it streams (its max_tokens is the recorded length), which decides the
// paper's row a result is set beside.
func (o Options) LengthKnown() bool { return o.MaxTokensMode == MaxTokensRecorded }

// Systems a replay is sent to.
const (
	// FCFS is the simulator alone: its FIFO of sequences, the paper's
	// baseline.
	FCFS = "fcfs"
	// Sluice is Sluice's POST /v1/chat/completions.
	Sluice = "sluice"
)

// DefaultOptions are sluice-bench fairness's defaults: the whole trace
// 4× faster than recorded, the recorded output bounds, the paper's cost
// of a request, the pools' default permits.
func DefaultOptions() Options {
	d := config.Default()
	return Options{MaxTokensMode: MaxTokensRecorded, Speed: 4, Duration: 600, Drain: 60, OutputWeight: 2,
		ShortPerms: d.Pools.Short.MaxConcurrency, LongPerms: d.Pools.Long.MaxConcurrency, QueuePerPermit: d.API.QueuePerPermit}
}

// Validate checks the options (named by sluice-bench's flags) and sets
// Batch when it is 0.
func (o *Options) Validate() error {
	switch {
	case o.MaxTokensMode != MaxTokensRecorded && o.MaxTokensMode != MaxTokens1024 && o.MaxTokensMode != MaxTokensOmitted:
		return fmt.Errorf("-max-tokens-mode: %q is none of %s, %s and %s", o.MaxTokensMode, MaxTokensRecorded, MaxTokens1024, MaxTokensOmitted)
	case !(o.Speed > 0) || !(o.Duration > PaperSpec.Warmup) || o.Drain < 0:
		return fmt.Errorf("-speed must be positive, -duration above %v s and -drain not negative", PaperSpec.Warmup)
	case !(o.QueuePerPermit >= 0):
		return errors.New("-queue-per-permit must not be negative")
	case o.ShortPerms < 1 || o.LongPerms < 1 || o.Batch < 0:
		return errors.New("-short-permits and -long-permits must be positive, -batch not negative")
	}
	if o.Batch == 0 {
		o.Batch = max(o.ShortPerms, o.LongPerms)
	}
	if o.ShortPerms > o.Batch || o.LongPerms > o.Batch {
		return fmt.Errorf("-short-permits %d and -long-permits %d must not exceed -batch %d: the pools share the simulator's sequences", o.ShortPerms, o.LongPerms, o.Batch)
	}
	return nil
}

// Run is one workload prepared for its replays, and the replays.
type Run struct {
	Workload Workload
	Rows     []Row
	Sizing   Sizing
	Spec     Spec
	// Keys are the clients' API keys, a tenant each.
	Keys map[string]config.APIKey
	// Bodies are the rows' requests; SimPrompt the prompt tokens the
	// simulator counts of each, SluicePrompt those Sluice counts (the
	// directive included), which route it.
	Bodies                  [][]byte
	SimPrompt, SluicePrompt []int
	// Framing is the chat framing's tokens, the shortest prompt.
	Framing int
	Systems []*System
}

// System is one replay of a workload and what it measured.
type System struct {
	Name string
	// Label names it in the report.
	Label    string
	Outcomes []Outcome
	Reqs     []Req
	Result   Result
	Took     time.Duration
	// Sluice only: the pools after the replay, and how long they took to
	// be idle (-1: not within a minute).
	Final     []PoolState
	IdleAfter time.Duration
}

// PoolState is a pool's permits in use and queue after a replay.
type PoolState struct {
	Pool           string
	InUse, Waiting int
}

// FairTier is the clients' tier: the standard tier's weight, for all.
const FairTier = "fair"

// Prepare reads w from dir, sizes its simulator and writes its requests;
// o must have passed Validate (which sets its Batch).
func Prepare(w Workload, dir string, o Options, writer *PromptWriter) (*Run, error) {
	all, err := Load(w.Path(dir))
	if err != nil {
		return nil, err
	}
	run := &Run{Workload: w, Keys: map[string]config.APIKey{}, Framing: writer.Framing}
	for _, r := range all {
		if r.Arrival < o.Duration {
			run.Rows = append(run.Rows, r)
		}
	}
	// The capacity is sized on the whole trace, so that a shorter replay
	// runs on the same simulator as a whole one.
	run.Sizing = SizeSimulator(all, o.Batch, w.Paper[0].Throughput)
	run.Spec = PaperSpec
	run.Spec.Span = o.Duration
	for i, c := range RowClients(run.Rows) {
		k := fmt.Sprintf("%s-%02d", FairTier, i)
		run.Keys[c] = config.APIKey{Key: "k-" + k, Tenant: k, Tier: FairTier}
	}
	model := config.Default().Pools.Short.Model
	for _, r := range run.Rows {
		msg, simCount := writer.Message(r)
		maxTokens := r.Output
		switch o.MaxTokensMode {
		case MaxTokens1024:
			maxTokens = 1024
		case MaxTokensOmitted:
			maxTokens = 0
		}
		run.Bodies = append(run.Bodies, ChatBody(model, msg, maxTokens))
		run.SimPrompt = append(run.SimPrompt, simCount)
		run.SluicePrompt = append(run.SluicePrompt, writer.Counter.CountChat([]tokens.Message{{Role: "user", Content: msg}}))
	}
	return run, nil
}

// Configure gives every client a tenant of its own at equal weight (the
// standard tier's, none of its rate limits) and lets a request wait as
// long as the replay lasts, as the paper's server queue does: no rate
// limits, no queue caps but the pools', no healer changing the permits,
// connections for every request at once.
func (run *Run) Configure(cfg *config.Config, o Options) {
	std := cfg.Limits.Tiers["standard"]
	cfg.Limits.Tiers[FairTier] = policy.Tier{Weight: std.Weight, MaxWait: std.MaxWait, MaxQueuePerTenant: std.MaxQueuePerTenant}
	for _, c := range RowClients(run.Rows) {
		cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, run.Keys[c])
	}
	wait := time.Duration((o.Duration+o.Drain)/o.Speed*float64(time.Second)) + 10*time.Minute
	tier := cfg.Limits.Tiers[FairTier]
	tier.MaxWait, tier.MaxQueuePerTenant = wait, 0
	cfg.Limits.Tiers[FairTier] = tier
	cfg.Admission.MaxWait = wait
	cfg.Admission.OutputTokenWeight = o.OutputWeight
	if o.MaxTokensMode == MaxTokensOmitted {
		// api.default_max_tokens (128) would cut most answers short.
		cfg.API.DefaultMaxTokens = OmittedBudget
		cfg.API.MaxTokensLimit = max(cfg.API.MaxTokensLimit, OmittedBudget)
	}
	cfg.Healing.Enabled = false
	cfg.API.QueuePerPermit = o.QueuePerPermit
	cfg.Pools.Short.MaxConcurrency, cfg.Pools.Long.MaxConcurrency = o.ShortPerms, o.LongPerms
	// Both pools name the one simulator: they share its sequences.
	cfg.Pools.Shared.MaxConcurrency = o.Batch
	if o.OnePool {
		cfg.Pools.Short.MaxConcurrency = o.Batch
		cfg.Pools.Short.MaxPromptTokens = cfg.Pools.Long.MaxPromptTokens
		cfg.Routing.ShortThresholdTokens = cfg.Pools.Long.MaxPromptTokens
	}
	// Every answer ends at its recorded length; a notice after one cut
	// by max_tokens would be a token the backend did not produce.
	cfg.LLM.TruncationNotice = ""
	conns := len(run.Rows) + 64
	cfg.API.MaxConnsPerIP, cfg.API.MaxConns = conns, max(cfg.API.MaxConns, conns)
	cfg.API.WaitingRoom = max(cfg.API.WaitingRoom, len(run.Rows))
	cfg.Admission.MaxQueueDepth = max(cfg.Admission.MaxQueueDepth, len(run.Rows))
}

// SluiceTarget is Sluice's chat endpoint at each base URL, each row with
// its client's key.
func (run *Run) SluiceTarget(baseURLs ...string) Target {
	t := Target{System: Sluice, Headers: func(r Row) map[string]string {
		return map[string]string{"Authorization": "Bearer " + run.Keys[r.Client].Key}
	}}
	for _, u := range baseURLs {
		t.URLs = append(t.URLs, u+"/v1/chat/completions")
	}
	return t
}

// SimulatorTarget is the simulator's own chat endpoint: FCFS.
func SimulatorTarget(simURL string) Target {
	return Target{System: FCFS, URLs: []string{simURL + "/v1/chat/completions"}}
}

// Replay replays the run's rows against target with a client of its own
// (a connection for every request), calling started with the replay once
// its clock runs (for a progress line), and measures it. The caller adds
// the system to Systems when it is done with it.
func (run *Run) Replay(ctx context.Context, target Target, o Options, started func(*Replay)) (*System, error) {
	tr := &http.Transport{MaxIdleConns: len(run.Rows), MaxIdleConnsPerHost: len(run.Rows), IdleConnTimeout: time.Minute, DisableCompression: true}
	defer tr.CloseIdleConnections()
	target.Client = &http.Client{Transport: tr}
	rp := &Replay{Target: target, Rows: run.Rows, Bodies: run.Bodies, Speed: o.Speed, Until: o.Duration + o.Drain}
	rp.Begin()
	if started != nil {
		started(rp)
	}
	rp.Run(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fs := &System{Name: target.System, Label: DefaultLabel(target.System), Outcomes: rp.Outcomes, Took: time.Since(rp.t0), IdleAfter: -1}
	fs.Reqs = rp.Reqs(run.SimPrompt)
	fs.Result = Measure(fs.Reqs, run.Spec)
	return fs, nil
}

// WaitSimulatorIdle waits up to within for sim to run and hold nothing:
// the cut requests leave it at its next step.
func WaitSimulatorIdle(sim *llmsim.Server, within time.Duration) {
	for t0 := time.Now(); time.Since(t0) < within; time.Sleep(100 * time.Millisecond) {
		if st := sim.Stats(); st.Running+st.Waiting == 0 {
			return
		}
	}
}

// System is the replay named name ("fcfs", "sluice"), nil if none.
func (run *Run) System(name string) *System {
	for _, fs := range run.Systems {
		if fs.Name == name {
			return fs
		}
	}
	return nil
}

// DefaultLabel names a system in the report.
func DefaultLabel(name string) string {
	if name == FCFS {
		return "FCFS (simulator alone, this run)"
	}
	return "Sluice (this run)"
}
