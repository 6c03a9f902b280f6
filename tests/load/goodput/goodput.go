package goodput

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/tests/load/internal/bare"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/progress"
	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
)

// The goodput benchmark shows how much Sluice serves as more requests
// wait: answers completed per second (goodput) and time to first token
// against offered load, for Sluice and, on the same stack in the same
// run, for the bare workflow of Sluice's shape (internal/bare) with no
// admission at all. First closed loop, at multiples of the pool's permits
// P as concurrent clients; then open loop, Poisson arrivals at multiples
// of the capacity the closed loop measured for Sluice with P clients. At
// each load Sluice runs first, then the bare workflow. After each step
// the histories of a sample of its workflows are read, to count what a
// request costs Temporal, admitted at once and queued.

type goodputOptions struct {
	// The stack: the short pool's permits, each answer's length, whether
	// the healer runs.
	permits, maxTokens int
	healing            bool
	// The loads: multiples of P clients (closed loop) and of the capacity
	// (open loop, arrivals/s); 0 capacity is the one measured.
	closed, open string
	capacity     float64
	// Each step's warm-up and window; each request's patience; the open
	// loop's cap on requests in flight (0: 20 × P).
	warmup, step, timeout time.Duration
	maxInFlight           int
	// Histories read per step; the systems, in order; the arrival seed.
	histories int
	systems   string
	seed      uint64
	// sloTier names the slo benchmark's tier whose SLO an answer must
	// meet to count in the goodput within SLO.
	sloTier string
	// The report's directory, and whether a missed goal fails the run.
	out    string
	strict bool
}

// goodputScenario is the goodput benchmark: its flags, the parsed loads,
// and every step it ran.
type goodputScenario struct {
	goodputOptions
	closedList, openList []float64
	systemList           []string
	// slo is the SLO the goodput within SLO judges by.
	slo slo.Tier
	// cfg is the stack's configuration, for the report.
	cfg config.Config
	// measured is the capacity the open loop used.
	measured float64
	steps    []*goodputStep
	// For the progress line: the step sending its load, or between
	// steps, what the scenario waits for.
	cur  atomic.Pointer[stepRun]
	prog progress.Meter
}

func (g *goodputScenario) Flags(fs *flag.FlagSet) {
	fs.IntVar(&g.permits, "permits", 16, "permits P of the short pool (the simulator runs P sequences at once)")
	fs.IntVar(&g.maxTokens, "max-tokens", 16, "max_tokens of each request (every answer is this long)")
	fs.BoolVar(&g.healing, "healing", false, "run the healer (off: it would change the permits between steps)")
	fs.StringVar(&g.closed, "closed", "0.5,1,2,4,8", "closed-loop steps: concurrent clients as multiples of P (the open loop's capacity is measured at 1)")
	fs.StringVar(&g.open, "open", "0.5,1,2,4", "open-loop steps: Poisson arrivals as multiples of the capacity")
	fs.Float64Var(&g.capacity, "capacity", 0, "the open loop's 1× in requests/s (0: Sluice's goodput in the closed-loop step at P clients)")
	fs.DurationVar(&g.warmup, "warmup", 5*time.Second, "unmeasured load at the start of each step")
	fs.DurationVar(&g.step, "step", 20*time.Second, "measured window of each step")
	fs.DurationVar(&g.timeout, "timeout", 60*time.Second, "a client gives up on its request after this long")
	fs.IntVar(&g.maxInFlight, "max-in-flight", 0, "open loop: most requests in flight at once; arrivals beyond are shed by the client (0: 20 × P)")
	fs.IntVar(&g.histories, "histories", 200, "workflow histories read per step and system")
	fs.StringVar(&g.systems, "systems", sysSluice+","+sysBare, "systems to drive at each load, in order")
	fs.Uint64Var(&g.seed, "seed", 1, "seed of the open loop's arrival times")
	fs.StringVar(&g.out, "out", "tests/load/report", "directory of the report (goodput.md, goodput.csv, goodput.png)")
	fs.BoolVar(&g.strict, "strict", false, "a missed goal fails the run")
	fs.StringVar(&g.sloTier, "slo", slo.Tiers[slo.Interactive].Name, "the slo benchmark's tier whose SLO (TTFT, time per output token) an answer must meet to count in the goodput within SLO")
}

// The systems a step drives.
const (
	sysSluice = "sluice"
	sysBare   = "bare"
)

// Loops.
const (
	loopClosed = "closed"
	loopOpen   = "open"
)

// goodputStep is one system under one load, as measured.
type goodputStep struct {
	loop   string
	mult   float64
	system string
	// clients (closed loop) or arrivals/s (open loop) offered, and the
	// seed of the arrival times.
	clients int
	rate    float64
	seed    uint64
	window  time.Duration
	// reqs are the requests that ended within the window.
	reqs []attempt
	// Open loop: arrivals within the window, and those the client shed.
	arrivals, shed int
	// cpu is where CPU went within the window; hist is the sample of
	// the step's histories.
	cpu  windowCPU
	hist histSummary
}

func (g *goodputScenario) Stacks() ([]stack.Options, error) {
	var err error
	if g.closedList, err = scenario.Positives("closed", "multiple", g.closed, scenario.ParseFloat); err != nil {
		return nil, err
	}
	if g.openList, err = scenario.Positives("open", "multiple", g.open, scenario.ParseFloat); err != nil {
		return nil, err
	}
	for _, s := range strings.Split(g.systems, ",") {
		if s != sysSluice && s != sysBare {
			return nil, fmt.Errorf("-systems: %q is neither %s nor %s", s, sysSluice, sysBare)
		}
		g.systemList = append(g.systemList, s)
	}
	if g.permits < 1 || g.maxTokens < 1 || g.step <= 0 || g.timeout <= 0 {
		return nil, errors.New("-permits, -max-tokens, -step and -timeout must be positive")
	}
	if g.maxInFlight <= 0 {
		g.maxInFlight = 20 * g.permits
	}
	if g.slo, err = slo.TierNamed(g.sloTier); err != nil {
		return nil, fmt.Errorf("-slo: %w", err)
	}
	if len(g.openList) > 0 && g.capacity <= 0 && (!g.has(sysSluice) || !containsFloat(g.closedList, 1)) {
		return nil, errors.New("the open loop needs -capacity, or -closed with 1 and -systems with sluice to measure it")
	}
	return []stack.Options{{
		Quiet: true,
		// One replica running P sequences at once: Sluice never sends
		// more than P, and the bare workflow's excess waits in the
		// simulator's own queue, as it would at a real backend.
		Simulator: func(sim *llmsim.Config) { sim.MaxNumSeqs = g.permits },
		Configure: func(cfg *config.Config) {
			cfg.Limits.Enabled = false
			cfg.Healing.Enabled = g.healing
			cfg.Pools.Short.MaxConcurrency = g.permits
			// Every client is on 127.0.0.1: the per-address connection
			// cap, a flood guard, would refuse the open loop's excess
			// (closing the connection) before the client's own cap on
			// requests in flight, measuring the guard, not admission.
			if need := g.maxInFlight + 16; cfg.API.MaxConnsPerIP < need {
				cfg.API.MaxConnsPerIP, cfg.API.MaxConns = need, max(cfg.API.MaxConns, need)
			}
		},
	}}, nil
}

func (g *goodputScenario) has(system string) bool {
	for _, s := range g.systemList {
		if s == system {
			return true
		}
	}
	return false
}

func containsFloat(xs []float64, x float64) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// goodputEnv is what the steps send with: a requester per system.
type goodputEnv struct {
	do map[string]requester
}

func (g *goodputScenario) Drive(ctx context.Context, st *stack.Stack) error {
	g.cfg = st.Config
	b, err := bare.Start(ctx, st)
	if err != nil {
		return err
	}
	defer b.Worker.Stop()
	// Each bare client blocks on its own XREAD: their connections come
	// from a pool of their own, large enough for all of them, not from
	// the one the bare activities write through.
	readers := redis.NewClient(&redis.Options{Addr: st.Config.Redis.Addr, PoolSize: g.maxInFlight + 16})
	defer readers.Close()
	env := goodputEnv{do: map[string]requester{
		sysSluice: g.sluiceRequester(st, st.Client(g.maxInFlight)),
		sysBare:   g.bareRequester(st, b, readers),
	}}
	for _, m := range g.closedList {
		clients := max(1, int(math.Round(m*float64(g.permits))))
		if err := g.runLoad(ctx, st, env, &goodputStep{loop: loopClosed, mult: m, clients: clients}); err != nil {
			return err
		}
	}
	if len(g.openList) == 0 {
		return nil
	}
	g.measured = g.capacity
	if s := g.find(loopClosed, 1, sysSluice); g.measured <= 0 && s != nil {
		g.measured = s.goodput()
	}
	if g.measured <= 0 {
		return errors.New("no capacity for the open loop: Sluice completed nothing with P clients")
	}
	for i, m := range g.openList {
		// Both systems get the same arrivals at a load.
		if err := g.runLoad(ctx, st, env, &goodputStep{loop: loopOpen, mult: m, rate: m * g.measured, seed: g.seed + uint64(i)}); err != nil {
			return err
		}
	}
	return nil
}

// runLoad runs one load on each system in turn.
func (g *goodputScenario) runLoad(ctx context.Context, st *stack.Stack, env goodputEnv, load *goodputStep) error {
	for _, sys := range g.systemList {
		s := *load
		s.system = sys
		if err := g.runStep(ctx, st, env.do[sys], &s); err != nil {
			return err
		}
		g.steps = append(g.steps, &s)
		fmt.Fprintf(os.Stderr, "%s goodput %s: %s\n", time.Now().Format("15:04:05"), s.label(), s.summary(g.slo))
	}
	return nil
}

// runStep sends a step's load, then waits for the pools to be idle and
// reads a sample of the step's histories.
func (g *goodputScenario) runStep(ctx context.Context, st *stack.Stack, do requester, s *goodputStep) error {
	s.window = g.step
	run := newStepRun(s.label(), g.warmup, g.step, g.timeout)
	g.cur.Store(run)
	cpu := run.cpuInWindow(ctx)
	if s.loop == loopClosed {
		run.closedLoop(ctx, s.clients, do)
	} else {
		run.openLoop(ctx, s.rate, g.maxInFlight, s.seed, do)
	}
	g.prog.Enter("wait-idle", -1)
	g.cur.Store(nil)
	if err := ctx.Err(); err != nil {
		return err
	}
	s.cpu = <-cpu
	s.reqs, s.arrivals, s.shed = run.ended, run.arrivals, run.shed
	// Requests cut off by their client may still hold a permit or a
	// place in the queue: the next step starts from idle pools.
	if _, _, err := stack.WaitIdle(ctx, st.Core.Gate, g.timeout); err != nil {
		return err
	}
	g.prog.Enter("read-histories", -1)
	s.hist = sampleHistories(ctx, st.Core.Temporal, s.reqs, g.histories)
	return nil
}

func (g *goodputScenario) Status(st *stack.Stack) string {
	if r := g.cur.Load(); r != nil {
		return r.status() + " " + st.PoolsNow()
	}
	return g.prog.String() + " " + st.PoolsNow()
}

// sluiceRequester sends POST /v1/chat as an anonymous caller.
func (g *goodputScenario) sluiceRequester(st *stack.Stack, hc *http.Client) requester {
	return func(ctx context.Context, i int) chat.Result {
		body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, chat.Queries[i%len(chat.Queries)], g.maxTokens)
		return chat.Read(ctx, hc, st.BaseURL, body, nil)
	}
}

// bareRequester runs the bare workflow with the prompt Sluice would build,
// writing "done" from its stream as Sluice does.
func (g *goodputScenario) bareRequester(st *stack.Stack, b *bare.Setup, readers *redis.Client) requester {
	var seq atomic.Int64
	run := time.Now().UnixNano()
	return func(ctx context.Context, i int) chat.Result {
		id := fmt.Sprintf("bare-goodput-%d-%d", run, seq.Add(1))
		ttft, total, err := bare.Run(ctx, st.Core.Temporal, readers, bare.Queue, id, b.Prompts[chat.Queries[i%len(chat.Queries)]], g.maxTokens, true)
		switch {
		case err == nil:
			// Its done is written right after its last token: the
			// answer's pace is what lies between the first and done.
			return chat.Result{Kind: chat.KindDone, ID: id, TTFT: ttft, Last: total, Tokens: g.maxTokens}
		case ctx.Err() != nil:
			return chat.Result{Kind: chat.KindHang, ID: id}
		}
		return chat.Result{Kind: "error bare_workflow", ID: id}
	}
}

// find returns the step of a loop, multiple and system (nil: none).
func (g *goodputScenario) find(loop string, mult float64, system string) *goodputStep {
	for _, s := range g.steps {
		if s.loop == loop && s.mult == mult && s.system == system {
			return s
		}
	}
	return nil
}
