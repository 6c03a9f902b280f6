package fairness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/load"
	"github.com/sluice-dev/sluice/tests/load/internal/progress"
	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/vtc"
)

// The slo benchmark asks what each tier's clients get when more is asked
// than the model can serve. One pool (every prompt is short, and both
// pools name the one simulator, so they share one budget of its
// sequences) and two tiers, each one tenant with no rate limits:
// interactive (weight 5; a first token within a second, then at most
// 100 ms a token) and batch (weight 1; a first token within a minute).
// Poisson arrivals, each drawn interactive or batch by the same seeded
// generator and its answer's length drawn from the workload, come at
// multiples of the capacity, measured first in the same run: a closed
// loop of as many clients as the simulator runs sequences, straight to
// the simulator, every answer of the workload's mean length. Each load
// runs over several seeds, and each seed's arrivals go to every mode:
// Sluice (a fresh stack a mode) and FCFS, straight to the simulator's
// OpenAI endpoint, whose own queue is first come, first served.
// Everything is measured where the client stands, per arrival: one
// refused, timed out or not sent missed its SLO.

// sloTenant and sloKey are a tier's one tenant and its API key.
func sloTenant(tier int) string { return "slo-" + slo.Tiers[tier].Name }
func sloKey(tier int) string    { return "k-slo-" + slo.Tiers[tier].Name }

// sloMode is one way of serving the arrivals.
type sloMode struct {
	key, name string
	// configure, for a mode through Sluice, is what it changes in make
	// run's configuration, on a stack of its own; nil for FCFS, which
	// runs straight to the simulator of the first stack.
	configure func(cfg *config.Config)
}

const (
	modeSluice  = "sluice"
	modeHealing = "healing"
	modePreempt = "preempt"
	modeFCFS    = "fcfs"
)

// sloModes are the modes -modes chooses from. Healing is not a default: the healer acts on a pool's latency tail
// (shrinking its batch, throttling long requests, shedding the lowest
// tier's waiters), none of which frees a running sequence sooner, which
// is what an interactive arrival at 2× waits for, and it would add a
// stack's worth of steps.
var sloModes = []sloMode{
	{key: modeSluice, name: "Sluice, no preemption", configure: func(cfg *config.Config) { cfg.Healing.Enabled = false }},
	{key: modeHealing, name: "Sluice, no preemption, healing on", configure: func(cfg *config.Config) { cfg.Healing.Enabled = true }},
	{key: modePreempt, name: "Sluice with preemption", configure: preempting},
	{key: modeFCFS, name: "FCFS (simulator)"},
}

// preempting is Sluice with preemption on: the interactive tier's
// requests are served in the priority class, the batch tier's in flex,
// each class at its tier's weight (so the fair order is the sluice
// mode's), and the pools' backend, the simulator, continues answers, so
// a flex stream may be paused for an interactive arrival.
func preempting(cfg *config.Config) {
	cfg.Healing.Enabled = false
	cfg.Admission.Preemption.Enabled = true
	cfg.Pools.Short.Continuation = config.ContinuationVLLM
	cfg.Pools.Long.Continuation = config.ContinuationVLLM
	for i, t := range slo.Tiers {
		class := request.ClassFlex
		if i == slo.Interactive {
			class = request.ClassPriority
		}
		tier := cfg.Limits.Tiers[t.Name]
		tier.DefaultClass = class
		tier.Classes = map[string]policy.ClassLimits{class: {Weight: tier.Weight, TTFTSLO: t.TTFT, TPOTSLO: t.TPOT}}
		cfg.Limits.Tiers[t.Name] = tier
	}
}

func modeOf(key string) sloMode {
	for _, m := range sloModes {
		if m.key == key {
			return m
		}
	}
	return sloMode{key: key, name: key}
}

func modeName(key string) string { return modeOf(key).name }

// sloScenario is the slo benchmark: its flags, then what it measured.
type sloScenario struct {
	loads, modes        string
	workloadName, dir   string
	interactive         float64
	interactiveWait     time.Duration
	seqs, maxTokens     int
	seeds               int
	timeScale           float64
	warmup, window      time.Duration
	timeout, capWindow  time.Duration
	capacity            float64
	maxInFlight         int
	seed                uint64
	sampleEvery         time.Duration
	loadList            []float64
	modeList, stackMode []string
	workload            sloWorkload

	// sim is the simulator's configuration, cfg the first stack's.
	sim llmsim.Config
	cfg config.Config
	// measured is the capacity the loads are multiples of (capMeasured:
	// measured, not given), meanAnswer the mean time an answer of the
	// workload's mean length took then; promptTokens the longest prompt
	// sent straight to the simulator.
	measured     float64
	meanAnswer   time.Duration
	capMeasured  bool
	promptTokens atomic.Int64
	steps        []*sloStep
	stacksDone   int

	cur  atomic.Pointer[sloRun]
	prog progress.Meter
}

func (s *sloScenario) Flags(fs *flag.FlagSet) {
	fs.StringVar(&s.workloadName, "workload", workloadFixed, "answer lengths: fixed (every answer -max-tokens) or vtc (drawn from the output lengths of the VTC real trace in -dir)")
	fs.StringVar(&s.dir, "dir", vtc.DefaultDir, "directory of vtc-real.csv, for -workload vtc")
	fs.StringVar(&s.loads, "loads", "0.5,1,1.5,2", "open-loop steps: Poisson arrivals as multiples of the capacity")
	fs.IntVar(&s.seeds, "seeds", 5, "runs of each load, each with arrivals and lengths of its own seed; the goals take the median over them")
	fs.StringVar(&s.modes, "modes", modeSluice+","+modePreempt+","+modeFCFS, "modes, each with the same arrivals: sluice (Sluice, no preemption), healing (the same with healing on), preempt (Sluice pausing flex streams for interactive arrivals), each a stack of its own; fcfs (straight to the simulator)")
	fs.Float64Var(&s.interactive, "interactive", 1.0/3, "share of the arrivals that are interactive; the rest are batch")
	fs.DurationVar(&s.interactiveWait, "interactive-max-wait", slo.Tiers[slo.Interactive].MaxWait, "the interactive tier's max_wait")
	fs.IntVar(&s.seqs, "seqs", 16, "the simulator's max_num_seqs, and the pool's permits")
	fs.IntVar(&s.maxTokens, "max-tokens", 128, "-workload fixed: every answer's length in tokens (the simulator's natural length; max_tokens is one more)")
	fs.Float64Var(&s.timeScale, "time-scale", 1, "simulator time scale (1: real time)")
	fs.DurationVar(&s.warmup, "warmup", 5*time.Second, "arrivals before each step's window, not counted")
	fs.DurationVar(&s.window, "window", 20*time.Second, "each step's window: its arrivals are followed to their end")
	fs.DurationVar(&s.timeout, "timeout", 90*time.Second, "a client gives up this long after its arrival (the batch TTFT bound and time to read the longest answer)")
	fs.Float64Var(&s.capacity, "capacity", 0, "capacity in answers/s (0: measured, closed loop at -seqs clients straight to the simulator)")
	fs.DurationVar(&s.capWindow, "capacity-window", 15*time.Second, "the capacity measurement's window (after a 5s warm-up)")
	fs.IntVar(&s.maxInFlight, "max-in-flight", 800, "most requests in flight at once; the generator drops arrivals beyond (and counts them)")
	fs.Uint64Var(&s.seed, "seed", 1, "first seed of the arrival times, tiers and lengths (seed k of step i uses seed+100k+i in every mode)")
	fs.DurationVar(&s.sampleEvery, "sample", 500*time.Millisecond, "how often the queue is sampled for backlogged tiers")
}

func (s *sloScenario) Stacks() ([]stack.Options, error) {
	var err error
	if s.loadList, err = scenario.Positives("loads", "multiple", s.loads, scenario.ParseFloat); err != nil {
		return nil, err
	}
	if err := s.parseModes(); err != nil {
		return nil, err
	}
	if s.interactive < 0 || s.interactive > 1 {
		return nil, errors.New("-interactive must be within 0..1")
	}
	if s.seqs < 1 || s.maxTokens < 2 || s.seeds < 1 || s.timeScale <= 0 || s.window <= 0 || s.timeout <= 0 || s.maxInFlight < 1 || s.sampleEvery <= 0 {
		return nil, errors.New("-seqs, -seeds, -time-scale, -window, -timeout, -max-in-flight and -sample must be positive, -max-tokens at least 2")
	}
	if s.workload, err = newSLOWorkload(s.workloadName, s.maxTokens, s.dir); err != nil {
		return nil, err
	}
	s.sim = llmsim.DefaultConfig()
	s.simulator(&s.sim)
	fmt.Fprintf(os.Stderr, "slo: workload %s, %d loads × %d seeds × %d modes: expected about %.0f minutes\n",
		s.workload.name, len(s.loadList), s.seeds, len(s.modeList), s.expected().Minutes())
	out := make([]stack.Options, len(s.stackMode))
	for i, key := range s.stackMode {
		m := modeOf(key)
		out[i] = stack.Options{Quiet: true, Simulator: s.simulator, Configure: func(cfg *config.Config) {
			s.configure(cfg)
			if m.configure != nil {
				m.configure(cfg)
			}
		}}
	}
	return out, nil
}

// parseModes checks -modes and gives each Sluice mode a stack of its own;
// FCFS runs on the first, whose Sluice sits idle meanwhile.
func (s *sloScenario) parseModes() error {
	keys := make([]string, len(sloModes))
	for i, m := range sloModes {
		keys[i] = m.key
	}
	for _, key := range strings.Split(s.modes, ",") {
		key = strings.TrimSpace(key)
		m := modeOf(key)
		switch {
		case !slices.Contains(keys, key):
			return fmt.Errorf("-modes: %q is none of %s", key, strings.Join(keys, ", "))
		case m.configure != nil:
			s.stackMode = append(s.stackMode, key)
		}
		s.modeList = append(s.modeList, key)
	}
	if len(s.stackMode) == 0 {
		s.stackMode = []string{modeFCFS}
	}
	return nil
}

// simulator sizes the simulator: -seqs sequences, every answer without
// a directive the workload's mean length, so that a request's cost is
// the same in every mode.
func (s *sloScenario) simulator(sim *llmsim.Config) {
	sim.MaxNumSeqs = s.seqs
	sim.TimeScale = s.timeScale
	sim.AnswerMinTokens, sim.AnswerMaxTokens = s.workload.meanTokens(), s.workload.meanTokens()
}

// configure is make run's configuration with the pools' shared budget at
// the simulator's sequences, the two tiers and their tenants, and the
// per-address connection cap above the generator's.
func (s *sloScenario) configure(cfg *config.Config) {
	cfg.Pools.Short.MaxConcurrency = s.seqs
	cfg.Pools.Long.MaxConcurrency = min(cfg.Pools.Long.MaxConcurrency, s.seqs)
	cfg.Pools.Shared.MaxConcurrency = 0
	for i, t := range slo.Tiers {
		stack.AddOpenTenants(cfg, t.Name, []config.APIKey{{Key: sloKey(i), Tenant: sloTenant(i), Tier: t.Name}})
		tier := cfg.Limits.Tiers[t.Name]
		tier.Weight, tier.MaxWait = t.Weight, t.MaxWait
		if i == slo.Interactive {
			tier.MaxWait = s.interactiveWait
		}
		cfg.Limits.Tiers[t.Name] = tier
	}
	if need := s.maxInFlight + 16; cfg.API.MaxConnsPerIP < need {
		cfg.API.MaxConnsPerIP, cfg.API.MaxConns = need, max(cfg.API.MaxConns, need)
	}
}

// seedOf is the seed of run k of load step i.
func (s *sloScenario) seedOf(i, k int) uint64 { return s.seed + 100*uint64(k) + uint64(i) }

// Drive runs this stack's modes at every load, in load order, each over
// every seed, the first stack measuring the capacity first.
func (s *sloScenario) Drive(ctx context.Context, st *stack.Stack) error {
	stackMode := s.stackMode[s.stacksDone]
	first := s.stacksDone == 0
	s.stacksDone++
	env, err := newSLOEnv(ctx, s, st)
	if err != nil {
		return err
	}
	modes := []string{}
	for _, m := range s.modeList {
		if m == stackMode || (first && m == modeFCFS) {
			modes = append(modes, m)
		}
	}
	if first {
		s.cfg = st.Config
		if err := s.measureCapacity(ctx, env); err != nil {
			return err
		}
	}
	for i, mult := range s.loadList {
		for k := range s.seeds {
			for _, m := range modes {
				step := &sloStep{mode: m, mult: mult, rate: mult * s.measured, seed: s.seedOf(i, k), run: k, window: s.window}
				if err := s.runStep(ctx, st, env, step); err != nil {
					return err
				}
				s.steps = append(s.steps, step)
				fmt.Fprintf(os.Stderr, "%s slo %s\n", time.Now().Format("15:04:05"), step.line())
			}
		}
	}
	return nil
}

// measureCapacity sets the capacity the loads are multiples of: -capacity,
// or what -seqs closed-loop clients straight to the simulator get (the
// model's, without Sluice's overhead), every answer the workload's mean
// length (sloWorkload.meanTokens says why). It is taken by Little's law,
// the clients over their mean answer time: equal answers started
// together end in bursts of -seqs, which a count of answers in a window
// would alias.
func (s *sloScenario) measureCapacity(ctx context.Context, env *sloEnv) error {
	if s.capacity > 0 {
		s.measured = s.capacity
		s.meanAnswer = time.Duration(float64(s.seqs) / s.capacity * float64(time.Second))
		return nil
	}
	s.prog.Enter("capacity", 0)
	answer := func(ctx context.Context, c int) error {
		r := env.fcfs(ctx, slo.Batch, c, s.workload.meanTokens())
		s.prog.Add(1)
		if r.Kind != chat.KindDone {
			return errors.New(r.Kind)
		}
		return nil
	}
	load.ClosedLoop(ctx, 5*time.Second, s.seqs, answer) // to a full batch
	res := load.ClosedLoop(ctx, s.capWindow, s.seqs, answer)
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(res.Lat) == 0 || res.Errs > 0 {
		return fmt.Errorf("capacity: %d answers, %d failures straight from the simulator", len(res.Lat), res.Errs)
	}
	var sum time.Duration
	for _, d := range res.Lat {
		sum += d
	}
	s.meanAnswer = sum / time.Duration(len(res.Lat))
	s.measured, s.capMeasured = float64(s.seqs)/s.meanAnswer.Seconds(), true
	return nil
}

// computedCapacity is what the simulator's timing allows: -seqs answers
// per mean answer's time at a full batch (every decode step costs its
// base plus its share per sequence; the prompt's prefill once).
func (s *sloScenario) computedCapacity() float64 {
	step := s.sim.DecodeBase + time.Duration(s.sim.MaxNumSeqs)*s.sim.DecodePerSeq
	answer := time.Duration(s.workload.mean*float64(step)) + time.Duration(s.promptTokens.Load())*s.sim.PrefillPerToken
	return float64(s.sim.MaxNumSeqs) / (answer.Seconds() * s.sim.TimeScale)
}

// runStep sends one step's arrivals to one mode and follows each to its
// end; Sluice's queue is sampled meanwhile, and the pools left idle.
func (s *sloScenario) runStep(ctx context.Context, st *stack.Stack, env *sloEnv, step *sloStep) error {
	run := newSLORun(step.label(), s.warmup, s.window, s.timeout)
	s.cur.Store(run)
	defer s.cur.Store(nil)
	do := env.fcfs
	if step.mode != modeFCFS {
		do = env.sluice
		sctx, stop := context.WithDeadline(ctx, run.winEnd)
		defer stop()
		go run.sampleQueues(sctx, st, s.sampleEvery)
	}
	run.openLoop(ctx, step.rate, s.interactive, s.workload, s.maxInFlight, step.seed, do)
	if err := ctx.Err(); err != nil {
		return err
	}
	step.all, step.samples = run.all, run.samplesTaken()
	s.prog.Enter("wait-idle", -1)
	// Requests cut off by their client may still hold a permit or a place
	// in the queue for the disconnect grace: the next step starts idle.
	_, _, err := stack.WaitIdle(ctx, st.Core.Gate, s.timeout)
	return err
}

func (s *sloScenario) Status(st *stack.Stack) string {
	if r := s.cur.Load(); r != nil {
		return r.status() + " " + st.PoolsNow()
	}
	return s.prog.String() + " " + st.PoolsNow()
}

// sloEnv is how a stack's steps send: one requester per way in.
type sloEnv struct {
	sluice, fcfs sloRequester
}

// sloRequester sends arrival i of tier, its answer tokens long, and
// reads its answer to the end.
type sloRequester func(ctx context.Context, tier, i, tokens int) chat.Result

// maxTokensFor is the max_tokens of a request whose answer is tokens
// long: one more, so that the answer ends as the model's own
// (finish_reason stop), not cut at its limit, which Sluice's native API
// would end with its truncation notice, a token event more.
func maxTokensFor(tokens int) int { return tokens + 1 }

// newSLOEnv builds the requesters: POST /v1/chat with the tier's key, and
// the same prompt Sluice builds (retrieval included) posted to the
// simulator's OpenAI endpoint. Each asks for max_tokens one more than its
// answer's length (maxTokensFor); when the workload's lengths vary, its query begins with the
// simulator's answer-length directive (Sluice passes the query on as
// the last user message, where the simulator reads it).
func newSLOEnv(ctx context.Context, s *sloScenario, st *stack.Stack) (*sloEnv, error) {
	hc := st.Client(s.maxInFlight)
	prompts := make([][]openai.Message, len(chat.Queries))
	for i, q := range chat.Queries {
		msgs, err := st.Prompt(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("prompt of %q: %w", q, err)
		}
		prompts[i] = msgs
	}
	model, w := st.Config.Pools.Short.Model, s.workload
	simHC := st.Client(s.maxInFlight)
	completions := st.SimURL + "/v1/chat/completions"
	return &sloEnv{
		sluice: func(ctx context.Context, tier, i, tokens int) chat.Result {
			body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, w.query(chat.Queries[i%len(chat.Queries)], tokens), maxTokensFor(tokens))
			return chat.Read(ctx, hc, st.BaseURL, body, map[string]string{"Authorization": "Bearer " + sloKey(tier)})
		},
		fcfs: func(ctx context.Context, _, i, tokens int) chat.Result {
			body, err := fcfsBody(model, w.messages(prompts[i%len(prompts)], tokens), maxTokensFor(tokens))
			if err != nil {
				return chat.Result{Kind: "error " + err.Error()}
			}
			res, prompt := fcfsChat(ctx, simHC, completions, body)
			storeMax(&s.promptTokens, int64(prompt))
			return res
		},
	}, nil
}
