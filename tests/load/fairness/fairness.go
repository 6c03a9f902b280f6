package fairness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/vtc"
)

// The fairness benchmark measures Sluice's token fairness against the
// VTC paper's (Sheng et al., "Fairness in Serving Large Language
// Models", OSDI 2024). Each of the paper's workloads is replayed at its
// arrival times, every client a tenant of its own at equal weight,
// first straight to the simulator (whose FIFO of sequences is FCFS, the
// paper's baseline), then through Sluice's OpenAI endpoint, on one
// simulator sized so that the offered load is the multiple of its
// capacity it was of the paper's server. The paper's metrics
// (tests/load/vtc, which tests/multi replays on the cluster stack too)
// are computed from the times the client saw, in trace
// seconds; a speed factor compresses the trace and the simulator alike.

type fairnessOptions struct {
	vtc.Options
	workloads, dir, systems string
	// requestsCSV, if set, gets every request's times.
	requestsCSV string
}

// Systems a fairness run replays against.
const (
	sysFCFS   = vtc.FCFS
	sysSluice = vtc.Sluice
)

func (s *fairnessScenario) Flags(fs *flag.FlagSet) {
	d := vtc.DefaultOptions()
	fs.StringVar(&s.workloads, "workloads", "overload,real", "workloads to replay, in order (overload, real)")
	fs.StringVar(&s.dir, "dir", vtc.DefaultDir, "directory of vtc-overload.csv and vtc-real.csv")
	fs.StringVar(&s.systems, "systems", sysFCFS+","+sysSluice, "systems to replay each workload against, in order: fcfs (straight to the simulator), sluice")
	fs.StringVar(&s.MaxTokensMode, "max-tokens-mode", d.MaxTokensMode, "max_tokens of each request: recorded (its recorded output length), 1024 or omitted (the answer is still its recorded length, by the simulator's answer-length directive)")
	fs.Float64Var(&s.Speed, "speed", d.Speed, "run the trace and the simulator this many times faster than recorded")
	fs.Float64Var(&s.Duration, "duration", d.Duration, "replay the trace's first this many seconds (the metrics' span; 600 is all of it)")
	fs.Float64Var(&s.Drain, "drain", d.Drain, "trace seconds after -duration that open streams may finish before they are cut")
	fs.Float64Var(&s.OutputWeight, "output-weight", d.OutputWeight, "admission.output_token_weight: 2 charges prompt + 2 × max_tokens, the paper's cost of a request")
	fs.IntVar(&s.ShortPerms, "short-permits", d.ShortPerms, "permits of the short pool")
	fs.IntVar(&s.LongPerms, "long-permits", d.LongPerms, "permits of the long pool (prompts over routing.short_threshold_tokens)")
	fs.IntVar(&s.Batch, "batch", 0, "sequences the simulator runs at once, and the budget the two pools share on it (pools.shared.max_concurrency; 0: the larger pool's permits, as make run's)")
	fs.StringVar(&s.requestsCSV, "requests", "", "also write every request (client, arrival, first and last token, tokens, outcome) to this CSV")
	fs.Float64Var(&s.QueuePerPermit, "queue-per-permit", d.QueuePerPermit, "api.queue_per_permit: requests per permit a pool's admission queue holds before the rest wait at the door")
	fs.BoolVar(&s.OnePool, "one-pool", false, "route every request to the short pool (its prompt limit and the routing threshold raised to the long pool's), with -batch permits: one fair queue for the backend")
}

// fairnessScenario is the fairness benchmark: its flags, and a run per
// workload, each on a stack of its own (the simulator is sized to it).
type fairnessScenario struct {
	fairnessOptions
	systemList []string
	writer     *vtc.PromptWriter
	runs       []*vtc.Run
	next       int
	cfg        config.Config
	// For the progress line.
	cur     atomic.Pointer[vtc.Replay]
	curLoad atomic.Pointer[string]
}

func (s *fairnessScenario) Stacks() ([]stack.Options, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	var err error
	if s.writer, err = vtc.NewPromptWriter(tokens.CL100K); err != nil {
		return nil, err
	}
	var out []stack.Options
	for _, name := range strings.Split(s.workloads, ",") {
		w, ok := vtc.Workloads[strings.TrimSpace(name)]
		if !ok {
			return nil, fmt.Errorf("-workloads: unknown workload %q (overload, real)", name)
		}
		run, err := vtc.Prepare(w, s.dir, s.Options, s.writer)
		if err != nil {
			return nil, fmt.Errorf("%w (-dir names the directory of the VTC workloads)", err)
		}
		s.runs = append(s.runs, run)
		out = append(out, stack.Options{
			Quiet:     true,
			Simulator: func(sim *llmsim.Config) { run.Sizing.Apply(sim, s.Speed) },
			Configure: func(cfg *config.Config) { run.Configure(cfg, s.Options) },
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
	return s.Options.Validate()
}

func (s *fairnessScenario) Drive(ctx context.Context, st *stack.Stack) error {
	run := s.runs[s.next]
	s.next++
	s.cfg = st.Config
	name := run.Workload.Name
	s.curLoad.Store(&name)
	for _, sys := range s.systemList {
		fs, err := s.replaySystem(ctx, st, run, sys)
		if err != nil {
			return err
		}
		run.Systems = append(run.Systems, fs)
		fmt.Fprintf(os.Stderr, "%s fairness %s %s: %s\n", time.Now().Format("15:04:05"), name, sys, fs.Summary())
	}
	return nil
}

// replaySystem replays the run's rows against one system and waits until
// the simulator (and Sluice's pools) are idle again.
func (s *fairnessScenario) replaySystem(ctx context.Context, st *stack.Stack, run *vtc.Run, sys string) (*vtc.System, error) {
	target := vtc.SimulatorTarget(st.SimURL)
	if sys == sysSluice {
		target = run.SluiceTarget(st.BaseURL)
	}
	fs, err := run.Replay(ctx, target, s.Options, func(rp *vtc.Replay) { s.cur.Store(rp) })
	s.cur.Store(nil)
	if err != nil {
		return nil, err
	}
	if sys == sysSluice {
		final, idleAfter, err := stack.WaitIdle(ctx, st.Core.Gate, time.Minute)
		if err != nil {
			return nil, err
		}
		fs.IdleAfter = idleAfter
		for _, p := range final {
			fs.Final = append(fs.Final, vtc.PoolState{Pool: p.Pool, InUse: p.InUse, Waiting: p.Waiting})
		}
	}
	vtc.WaitSimulatorIdle(st.Sim, time.Minute)
	return fs, nil
}

func (s *fairnessScenario) Status(st *stack.Stack) string {
	rp := s.cur.Load()
	if rp == nil {
		return "phase=between-replays"
	}
	sim := st.Sim.Stats()
	line := fmt.Sprintf("workload=%s %s sim_running=%d sim_waiting=%d", *s.curLoad.Load(), rp.Status(), sim.Running, sim.Waiting)
	if rp.Target.System == sysSluice {
		line += " " + st.PoolsNow()
	}
	return line
}
