package fairness

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
)

// The pools benchmark is the two-tenant scenario that found fairness
// ending at the pool boundary: on make run's defaults (both pools on the
// one simulator), two tenants of equal weight, both backlogged, one asking
// long questions (routed to the long pool), one short ones; and a light
// third tenant asking a short question now and then, whose first token
// says what the short pool's clients wait while both heavy ones are
// backlogged. It runs side by side, each on a fresh stack: "shared" (the
// pools share one budget, as Sluice makes them since they name the same
// server) and "apart" (the long pool names the simulator by another
// address, so Sluice cannot tell, with the permits split 16/4 as they
// were): who gets the tokens, measured where the clients stand.

const poolsTier = "pools"

// The tenants, in report order.
var poolsTenants = []string{"long", "short", "probe"}

type poolsScenario struct {
	clients               int
	warmup, window        time.Duration
	maxTokens             int
	probeEvery            time.Duration
	apartShort, apartLong int
	modes                 string
	healing               bool

	runs []*poolsRun
	cur  atomic.Pointer[poolsRun]
}

func (p *poolsScenario) Flags(fs *flag.FlagSet) {
	fs.IntVar(&p.clients, "clients", 40, "closed-loop clients of each heavy tenant (long, short)")
	fs.DurationVar(&p.warmup, "warmup", 30*time.Second, "load before the measured window, for both tenants to be backlogged")
	fs.DurationVar(&p.window, "window", 2*time.Minute, "the measured window: requests that end in it count")
	fs.IntVar(&p.maxTokens, "max-tokens", 0, "max_tokens of each request (0: not sent; the simulator's answer length)")
	fs.DurationVar(&p.probeEvery, "probe-every", time.Second, "the light tenant's pause between its requests")
	fs.IntVar(&p.apartShort, "apart-short-permits", 16, "in mode apart, the short pool's permits")
	fs.IntVar(&p.apartLong, "apart-long-permits", 4, "in mode apart, the long pool's permits (make run's before pools shared)")
	fs.StringVar(&p.modes, "modes", "shared,apart", "modes to run, in order: shared, apart")
	fs.BoolVar(&p.healing, "healing", false, "run the healer (make run's default) in every mode")
}

// poolsRun is one mode's run: every request's result by tenant, and how
// often each heavy tenant had requests waiting.
type poolsRun struct {
	mode             string
	winStart, winEnd time.Time
	mu               sync.Mutex
	results          map[string][]poolsResult
	// samples counts the per-second looks at the queues; backlogged, per
	// tenant, those that found it waiting in some pool.
	samples    int
	backlogged map[string]int
	// seenSim is the most sequences the simulator held at once (running
	// and waiting); its MaxNumSeqs is what it runs.
	seenSim, simSeqs int
	// permits is each pool's held and decoding seconds of the window
	// (poolsutil.go).
	permits permitReading
	ended   atomic.Int64
}

// poolsResult is one request as its client saw it.
type poolsResult struct {
	chat.Result
	end   time.Time
	total time.Duration
}

func (p *poolsScenario) Stacks() ([]stack.Options, error) {
	var out []stack.Options
	for _, m := range strings.Split(p.modes, ",") {
		m = strings.TrimSpace(m)
		if m != "shared" && m != "apart" {
			return nil, fmt.Errorf("-modes: %q is neither shared nor apart", m)
		}
		run := &poolsRun{mode: m, results: map[string][]poolsResult{}, backlogged: map[string]int{}}
		p.runs = append(p.runs, run)
		out = append(out, stack.Options{
			Quiet:     true,
			Simulator: func(sim *llmsim.Config) { run.simSeqs = sim.MaxNumSeqs },
			Configure: func(cfg *config.Config) { p.configure(cfg, m) },
		})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-modes: none")
	}
	return out, nil
}

// configure is make run's configuration with the three tenants at one
// weight and no rate limits or bans (the load is to reach the queue), and
// in mode apart the pools made to look like two servers.
func (p *poolsScenario) configure(cfg *config.Config, mode string) {
	keys := make([]config.APIKey, len(poolsTenants))
	for i, t := range poolsTenants {
		keys[i] = config.APIKey{Key: "k-pools-" + t, Tenant: "pools-" + t, Tier: poolsTier}
	}
	stack.AddOpenTenants(cfg, poolsTier, keys)
	cfg.Limits.Ban.Enabled = false
	cfg.Healing.Enabled = p.healing
	if mode == "apart" {
		cfg.Pools.Long.Endpoints = []string{strings.Replace(cfg.Pools.Short.Endpoints[0], "127.0.0.1", "localhost", 1)}
		cfg.Pools.Short.MaxConcurrency, cfg.Pools.Long.MaxConcurrency = p.apartShort, p.apartLong
	}
}

func (p *poolsScenario) Drive(ctx context.Context, st *stack.Stack) error {
	run := p.runs[0]
	for _, r := range p.runs {
		if r.winStart.IsZero() {
			run = r
			break
		}
	}
	p.cur.Store(run)
	start := time.Now()
	run.winStart, run.winEnd = start.Add(p.warmup), start.Add(p.warmup+p.window)
	lctx, stop := context.WithDeadline(ctx, run.winEnd)
	defer stop()
	w := stack.StartWatch(lctx, st)
	go p.sampleQueues(lctx, st, run)
	hc := st.Client(2*p.clients + 1)
	permits := permitWindow(ctx, st.Client(1), st.BaseURL+"/metrics", run.winStart, run.winEnd)
	var wg sync.WaitGroup
	loop := func(tenant, query string, pause time.Duration) {
		defer wg.Done()
		for n := 0; lctx.Err() == nil; n++ {
			body := fmt.Sprintf(`{"query":%q}`, fmt.Sprintf("%d. %s", n, query))
			if p.maxTokens > 0 {
				body = fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, fmt.Sprintf("%d. %s", n, query), p.maxTokens)
			}
			began := time.Now()
			// A request still running at the window's end is cut: it
			// would not count anyway.
			res := chat.Read(lctx, hc, st.BaseURL, body, map[string]string{"Authorization": "Bearer k-pools-" + tenant})
			run.add(tenant, poolsResult{Result: res, end: time.Now(), total: time.Since(began)})
			if pause > 0 {
				select {
				case <-lctx.Done():
				case <-time.After(pause):
				}
			}
		}
	}
	for range p.clients {
		wg.Add(2)
		go loop("long", chat.LongQuery, 0)
		go loop("short", "What does weighted fair queuing guarantee?", 0)
	}
	wg.Add(1)
	go loop("probe", "How are permits leased?", p.probeEvery)
	wg.Wait()
	w.Stop()
	run.seenSim = int(w.Max.Sim)
	run.permits = <-permits
	// Let the cut requests' workflows end before the stack stops.
	_, _, err := stack.WaitIdle(ctx, st.Core.Gate, time.Minute)
	return err
}

func (r *poolsRun) add(tenant string, res poolsResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results[tenant] = append(r.results[tenant], res)
	r.ended.Add(1)
}

// sampleQueues looks at both pools' queues once a second within the
// window: a heavy tenant is backlogged when it has a request waiting.
func (p *poolsScenario) sampleQueues(ctx context.Context, st *stack.Stack, run *poolsRun) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if now.Before(run.winStart) {
				continue
			}
			waiting := map[string]bool{}
			for _, pool := range request.Pools() {
				qs, err := st.Core.Gate.QueueStats(ctx, pool)
				if err != nil {
					continue
				}
				for tenant, n := range qs.ByTenant {
					waiting[strings.TrimPrefix(tenant, "pools-")] = waiting[strings.TrimPrefix(tenant, "pools-")] || n > 0
				}
			}
			run.mu.Lock()
			run.samples++
			for tenant, ok := range waiting {
				if ok {
					run.backlogged[tenant]++
				}
			}
			run.mu.Unlock()
		}
	}
}

func (p *poolsScenario) Status(st *stack.Stack) string {
	run := p.cur.Load()
	if run == nil {
		return "phase=starting"
	}
	phase := "window"
	if time.Now().Before(run.winStart) {
		phase = "warmup"
	}
	return fmt.Sprintf("mode=%s phase=%s ended=%d %s", run.mode, phase, run.ended.Load(), st.PoolsNow())
}
