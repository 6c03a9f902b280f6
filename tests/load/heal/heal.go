package heal

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
	"github.com/sluice-dev/sluice/workflows"
)

// The heal scenario reproduces the tail problem of a mixed load on a
// shared backend and the healer's answer to it. Both pools send to one
// simulator, so the long pool's requests (long prompts, long answers)
// share batches and the KV cache with the short pool's: a long answer
// holds its growing blocks until its last token, and a short request
// behind it waits for blocks before its first token. The same open-loop
// mix (80% short, 20% long) runs twice on fresh stacks, healing off then
// on, while the bench samples each pool's P50/P99 of llm_first_token from
// the shared latency window (its own window, not the healer's) and the
// healer's decisions by query.

type healOptions struct {
	stack.MixFlags
	simFlags
	healerFlags
	// The load: Poisson arrivals, a share of them long.
	rate, longShare                     float64
	duration                            time.Duration
	seed                                uint64
	shortTokens, longTokens, longRepeat int
	// The bench's samples (those of fewer latencies than the healer's
	// min_samples are left out), the bound it asserts, the modes, the
	// report.
	sampleEvery, sampleWindow time.Duration
	minSamples                int64
	boundPolls                int
	modes, out                string
	// judge is what the report asserts: "clients" (their TTFT, first
	// tokens within the promise, queue timeouts, healing on vs off) or
	// "stages" (the short pool's llm_first_token P99/P50); the other is
	// reported beside it.
	judge string
}

func (h *healScenario) Flags(fs *flag.FlagSet) {
	h.MixFlags.Define(fs, 32, 8)
	h.simFlags.define(fs)
	h.healerFlags.define(fs)
	fs.Float64Var(&h.rate, "rate", 5, "requests per second, open loop")
	fs.DurationVar(&h.duration, "duration", 2*time.Minute, "how long each mode sends requests")
	fs.Float64Var(&h.longShare, "long-share", 0.2, "share of long requests")
	fs.Uint64Var(&h.seed, "seed", 1, "seed of the arrival times and the short/long draw (the same in both modes)")
	fs.IntVar(&h.shortTokens, "short-max-tokens", 128, "max_tokens of a short request")
	fs.IntVar(&h.longTokens, "long-max-tokens", 500, "max_tokens of a long request")
	fs.IntVar(&h.longRepeat, "long-repeat", 120, "a long query repeats a 15-token sentence this often")
	fs.DurationVar(&h.sampleEvery, "sample-every", 3*time.Second, "how often the bench samples P50/P99 and the healer")
	fs.DurationVar(&h.sampleWindow, "sample-window", 10*time.Second, "the window of each sample")
	fs.Int64Var(&h.minSamples, "min-samples", DefaultMinSamples, "healing.min_samples")
	fs.IntVar(&h.boundPolls, "bound-polls", 30, "with healing on, the short pool's P99/P50 must fall below 2 within this many healer polls of going above 5")
	fs.StringVar(&h.modes, "modes", "off,on", "modes to run, in order")
	fs.StringVar(&h.out, "out", "tests/load/report", "directory of the report (heal.md, heal.csv, heal.png)")
	fs.StringVar(&h.judge, "judge", "clients", "what the verdict asserts: clients (TTFT from the request, first tokens within the promise, queue timeouts) or stages (the short pool's llm_first_token P99/P50, which shows the healer acting)")
}

// healScenario is the heal benchmark: its flags and each mode's run.
type healScenario struct {
	healOptions
	keys []config.APIKey
	runs []*healRun
	live healLive
}

// simFlags shape the simulator both pools send to: its batch, its KV
// cache, the cost of a prompt and the length of an answer.
type simFlags struct {
	maxNumSeqs, kvBlocks int
	prefillPerTok        time.Duration
	answerMin, answerMax int
}

func (f *simFlags) define(fs *flag.FlagSet) {
	fs.IntVar(&f.maxNumSeqs, "max-num-seqs", 22, "simulator max_num_seqs per replica")
	fs.IntVar(&f.kvBlocks, "kv-blocks", 2048, "simulator KV blocks per replica (16 tokens each)")
	fs.DurationVar(&f.prefillPerTok, "prefill-per-token", 10*time.Microsecond, "simulator prefill cost per prompt token")
	fs.IntVar(&f.answerMin, "answer-min", 400, "simulator answer_min_tokens: a long answer runs to its max_tokens mostly")
	fs.IntVar(&f.answerMax, "answer-max", 2000, "simulator answer_max_tokens (natural answer length bound)")
}

func (f simFlags) simulator(sim *llmsim.Config) {
	sim.MaxNumSeqs = f.maxNumSeqs
	sim.KVCacheBlocks = f.kvBlocks
	sim.PrefillPerToken = f.prefillPerTok
	sim.AnswerMinTokens = f.answerMin
	sim.AnswerMaxTokens = f.answerMax
}

// healerFlags are the healer's settings, and the bound of its scaler.
type healerFlags struct {
	maxReplicas, healthyPolls     int
	costFactor                    float64
	criticalP99, interval, window time.Duration
	stage                         string
	// shortSLO and longSLO are the pools' healing.ttft_slo.
	shortSLO, longSLO time.Duration
}

func (f *healerFlags) define(fs *flag.FlagSet) {
	fs.IntVar(&f.maxReplicas, "max-replicas", 4, "the healer's scaler bound (simulator replicas)")
	fs.Float64Var(&f.costFactor, "long-cost-factor", 2, "healing.long_cost_factor: throttling divides the long pool's permits by it")
	fs.DurationVar(&f.criticalP99, "critical-p99", 0, "healing.critical_p99 (0: off)")
	fs.StringVar(&f.stage, "stage", "llm_first_token", "healing.stage: the series the healer watches (the report shows llm_first_token whatever it is)")
	fs.DurationVar(&f.interval, "interval", 2*time.Second, "healing.interval")
	fs.DurationVar(&f.window, "window", 10*time.Second, "healing.window (= healing.cooldown)")
	fs.IntVar(&f.healthyPolls, "healthy-polls", 10, "healing.healthy_polls: healthy polls in a row before a step back")
	d := config.Default().Pools
	fs.DurationVar(&f.shortSLO, "short-ttft-slo", d.Short.Healing.TTFTSLO, "pools.short.healing.ttft_slo: while the short pool's clients' TTFT P99 is within it, its tail alone does not make it critical (0: it does)")
	fs.DurationVar(&f.longSLO, "long-ttft-slo", d.Long.Healing.TTFTSLO, "pools.long.healing.ttft_slo")
}

func (f healerFlags) configure(cfg *config.Config, healing bool) {
	// Replicas serve both pools; the short pool owns the scaler, as its
	// tail is the one that matters here.
	cfg.Pools.Short.Scaler = config.Scaler{Kind: config.ScalerSimulator, URL: cfg.Pools.Short.Endpoints[0], BaseReplicas: 1, MaxReplicas: f.maxReplicas, Timeout: 5 * time.Second}
	cfg.Healing.Enabled = healing
	cfg.Healing.Interval = f.interval
	cfg.Healing.Window = f.window
	cfg.Healing.Cooldown = f.window
	cfg.Healing.HealthyPolls = f.healthyPolls
	cfg.Healing.LongCostFactor = f.costFactor
	cfg.Healing.CriticalP99 = f.criticalP99
	cfg.Healing.Stage = f.stage
	cfg.Pools.Short.Healing.TTFTSLO, cfg.Pools.Long.Healing.TTFTSLO = f.shortSLO, f.longSLO
}

const healTier = "heal"

// DefaultMinSamples is -min-samples unless set: the healer's
// healing.min_samples, below which the bench's samples are left out too.
const DefaultMinSamples = 30

var healPools = request.Pools()

// healSample is one look at both pools.
type healSample struct {
	At     time.Duration // since the load started
	Pools  map[string]latency.Stats
	Levels map[string]int
	Polls  int64
	// Sim is the simulator at the sample: its batch, queue, cache and
	// replicas, which is what the healer's actions change.
	Sim llmsim.Stats
}

// healRun is what one mode produced.
type healRun struct {
	Mode      string
	Samples   []healSample
	Decisions []workflows.Decision
	Start     time.Time
	Outcomes  map[string]int
	// Clients is what each pool's clients saw: the verdict where they
	// stand (client.go).
	Clients map[string]*clientTally
}

// healMode names a mode by whether healing is on.
func healMode(healing bool) string {
	if healing {
		return "on"
	}
	return "off"
}

// Stacks are one fresh stack per mode, alike but for healing.
func (h *healScenario) Stacks() ([]stack.Options, error) {
	if h.judge != "clients" && h.judge != "stages" {
		return nil, fmt.Errorf("-judge: %q is neither clients nor stages", h.judge)
	}
	h.keys = stack.TenantKeys(healTier, 4)
	var stacks []stack.Options
	for _, m := range strings.Split(h.modes, ",") {
		if m != "off" && m != "on" {
			return nil, fmt.Errorf("mode %q: want off or on", m)
		}
		stacks = append(stacks, stack.Options{Simulator: h.simulator, Quiet: true, Configure: func(cfg *config.Config) { h.configure(cfg, m == "on") }})
	}
	return stacks, nil
}

func (h *healScenario) simulator(sim *llmsim.Config) {
	h.MixFlags.Simulator(sim)
	h.simFlags.simulator(sim)
}

func (h *healScenario) configure(cfg *config.Config, healing bool) {
	h.MixFlags.Configure(cfg)
	h.healerFlags.configure(cfg, healing)
	cfg.Healing.MinSamples = h.minSamples
	cfg.Pools.Long.MaxPromptTokens = 8192
	// A long RAG prompt: the whole document pasted in.
	cfg.API.MaxQueryChars = max(cfg.API.MaxQueryChars, 2*len(h.longQuery()))
	cfg.Metrics.LatencySlot = time.Second
	// No rate limits: the load is to reach the pools.
	stack.AddOpenTenants(cfg, healTier, h.keys)
}

func (h *healScenario) longQuery() string {
	return strings.Repeat("Explain how weighted fair queuing shares one pool of permits. ", h.longRepeat)
}

// Drive runs one mode: the mix on a stack with healing as its
// configuration says, sampled throughout.
func (h *healScenario) Drive(ctx context.Context, st *stack.Stack) error {
	healing := st.Config.Healing.Enabled
	mode := healMode(healing)
	run := &healRun{Mode: mode, Outcomes: map[string]int{}, Clients: newClientTallies()}
	fmt.Fprintf(os.Stderr, "sluice-bench heal: healing %s, stack up; sending for %s\n", mode, h.duration)
	// Clients still running when the load and its last sample are over
	// are cut off: what they do then is not measured.
	lctx, cutOff := context.WithCancel(ctx)
	defer cutOff()
	run.Start = time.Now()
	h.live.begin(mode, run.Start)
	sampled := make(chan struct{})
	sctx, stopSampling := context.WithCancel(ctx)
	go func() {
		defer close(sampled)
		healSampleLoop(sctx, st, h.healOptions, healing, run, h.live.sampled)
	}()
	wait := h.send(ctx, lctx, st, run)
	// A last sample after the load, then stop.
	time.Sleep(h.sampleEvery)
	stopSampling()
	<-sampled
	cutOff()
	wait()
	fmt.Fprintf(os.Stderr, "sluice-bench heal: healing %s outcomes: %s\n", mode, report.OutcomeLine(run.Outcomes))
	if healing {
		s, err := queryHealing(ctx, st)
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		run.Decisions = s.Decisions
	}
	h.runs = append(h.runs, run)
	return nil
}

// send sends the mix for -duration, each request's client under clientCtx,
// and returns the wait for the clients.
func (h *healScenario) send(ctx, clientCtx context.Context, st *stack.Stack, run *healRun) (wait func()) {
	hc := st.Client(1000)
	longQ := h.longQuery()
	var mu sync.Mutex
	var wg sync.WaitGroup
	// Open loop with Poisson arrivals: evenly spaced ones of a fixed size
	// never queue below capacity and always above it, a knife edge real
	// traffic does not have; its bursts are what make a tail.
	rng := rand.New(rand.NewPCG(h.seed, h.seed))
	at := 0.0
	for i := 0; ctx.Err() == nil; i++ {
		at += rng.ExpFloat64() / h.rate
		if at >= h.duration.Seconds() {
			break
		}
		if d := time.Until(run.Start.Add(time.Duration(at * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
		// Every query differs: the simulator derives an answer's length
		// from its prompt, and the answer cache must not answer it.
		q, maxTokens, pool := fmt.Sprintf("How does a token bucket refill (question %d)?", i), h.shortTokens, request.PoolShort
		if rng.Float64() < h.longShare {
			q, maxTokens, pool = fmt.Sprintf("Document %d. %s", i, longQ), h.longTokens, request.PoolLong
		}
		body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, q, maxTokens)
		wg.Add(1)
		h.live.sent()
		go func(key string) {
			defer wg.Done()
			res := chat.Read(clientCtx, hc, st.BaseURL, body, map[string]string{"Authorization": "Bearer " + key})
			kind := res.Kind
			h.live.ended(kind)
			run.Clients[pool].add(res)
			if kind == chat.KindHang {
				kind = "cut off at the end"
			}
			mu.Lock()
			run.Outcomes[kind]++
			mu.Unlock()
		}(h.keys[i%len(h.keys)].Key)
	}
	return wg.Wait
}

func (h *healScenario) Report(r *report.Report) error {
	r.Header(fmt.Sprintf("%.0f%% short / %.0f%% long, Poisson at %.1f req/s for %s, healing %s", 100-100*h.longShare, 100*h.longShare, h.rate, h.duration, h.modes))
	stages, clients := healVerdicts(h.healOptions, h.runs), clientVerdicts(h.runs)
	for i := range stages {
		stages[i].Advisory = h.judge != "stages"
	}
	for i := range clients {
		clients[i].Advisory = h.judge == "stages"
	}
	v := append(clients, stages...)
	if h.judge == "stages" {
		v = append(stages, clients...)
	}
	if err := writeHealReport(h.healOptions, h.runs, v); err != nil {
		return err
	}
	for _, g := range v {
		r.Add(g)
	}
	// These goals are what make test asserts of the scenario.
	r.Strict = true
	return nil
}

// healSampleLoop samples both pools every o.sampleEvery into run, and
// hands each sample to seen.
func healSampleLoop(ctx context.Context, st *stack.Stack, o healOptions, healing bool, run *healRun, seen func(healSample)) {
	t := time.NewTicker(o.sampleEvery)
	defer t.Stop()
	series := make([]string, len(healPools))
	for i, p := range healPools {
		series[i] = latency.Series("llm_first_token", p)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		stats, err := st.Core.Latency.Snapshots(ctx, o.sampleWindow, series...)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sluice-bench heal: snapshot: %v\n", err)
			continue
		}
		s := healSample{At: time.Since(run.Start), Pools: map[string]latency.Stats{}, Levels: map[string]int{}, Sim: st.Sim.Stats()}
		for i, p := range healPools {
			s.Pools[p] = stats[i]
		}
		if healing {
			if hs, err := queryHealing(ctx, st); err == nil {
				s.Polls = hs.Polls
				for _, p := range hs.Pools {
					s.Levels[p.Pool] = p.Level
				}
			}
		}
		run.Samples = append(run.Samples, s)
		seen(s)
	}
}

func queryHealing(ctx context.Context, st *stack.Stack) (workflows.HealingStatus, error) {
	var hs workflows.HealingStatus
	v, err := st.Core.Temporal.QueryWorkflow(ctx, workflows.HealingWorkflowID(st.Config.Temporal.TaskQueue), "", workflows.QueryHealing)
	if err != nil {
		return hs, fmt.Errorf("query healer: %w", err)
	}
	if err := v.Get(&hs); err != nil {
		return hs, fmt.Errorf("decode healer status: %w", err)
	}
	return hs, nil
}

// shortRatios are the short pool's P99/P50 of the samples from `from` on
// (samples without enough latencies left out: their ratio is noise).
func shortRatios(r *healRun, from time.Duration, minCount int64) []float64 {
	var out []float64
	for _, s := range r.Samples {
		if st := s.Pools[request.PoolShort]; s.At >= from && st.Count >= minCount {
			out = append(out, st.TailRatio())
		}
	}
	return out
}

// shareAbove is the share of xs above x (0 when xs is empty).
func shareAbove(xs []float64, x float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	n := 0
	for _, v := range xs {
		if v > x {
			n++
		}
	}
	return float64(n) / float64(len(xs))
}

func healVerdicts(o healOptions, runs []*healRun) []report.Goal {
	var v []report.Goal
	// Each mode's second-half ratios and their share above 5, first, so
	// that "on" is compared with "off" whatever order they ran in.
	second := map[string][]float64{}
	share := map[string]float64{}
	for _, r := range runs {
		second[r.Mode] = shortRatios(r, o.duration/2, o.minSamples)
		share[r.Mode] = shareAbove(second[r.Mode], 5)
	}
	for _, r := range runs {
		switch r.Mode {
		case "off":
			// Without healing the tail comes and goes with the arrivals'
			// bursts, and in a collapse P50 rises with P99 (0.5–2 s), so
			// the ratio falls although nothing is healed: the median is
			// reported, the share of critical samples is what is asserted.
			v = append(v, report.NewGoal("healing off: short P99/P50 above 5, share of the second half's samples", fmt.Sprintf("%.0f%% (median %.1f)", 100*share[r.Mode], stats.Median(second[r.Mode])), ">= 25%", share[r.Mode] >= 0.25))
		case "on":
			// The first sample below 2 after the pool went critical, counted
			// in healer polls since the first critical sample.
			var firstPolls, critPolls int64 = -1, -1
			var critical bool
			for _, s := range r.Samples {
				st := s.Pools[request.PoolShort]
				if st.Count < o.minSamples {
					continue
				}
				if !critical && st.TailRatio() > 5 {
					critical, critPolls = true, s.Polls
				}
				if critical && st.TailRatio() < 2 {
					firstPolls = s.Polls - critPolls
					break
				}
			}
			measured := "never"
			if !critical {
				measured = "never critical"
			} else if firstPolls >= 0 {
				measured = fmt.Sprintf("%d polls", firstPolls)
			}
			v = append(v, report.NewGoal("healing on: short P99/P50 above 5, then below 2", measured, fmt.Sprintf("within %d polls", o.boundPolls), critical && firstPolls >= 0 && firstPolls <= int64(o.boundPolls)))
			// Stepping back while the load that needed the level is still
			// there brings the tail back once (then the hold doubles), so
			// the second half is compared with healing off, not with 0.
			if off, ok := share["off"]; ok {
				v = append(v, report.NewGoal("healing on: short P99/P50 above 5, share of the second half's samples", fmt.Sprintf("%.0f%% (median %.1f)", 100*share[r.Mode], stats.Median(second[r.Mode])),
					fmt.Sprintf("< healing off's %.0f%%", 100*off), share[r.Mode] < off))
			}
		}
	}
	return v
}
