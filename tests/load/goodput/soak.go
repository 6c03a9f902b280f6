package goodput

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/load"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
)

// The soak benchmark runs make run's shape — an API process with its
// embedded worker and a worker process beside it, Redis and the Temporal
// dev server keeping its state in a file — under a steady closed loop at
// the short pool's capacity for a long time, sampling every process's
// memory, and the goroutines and workflow cache of Sluice's own, to show
// that each levels off: judged on the last part of the load, each must
// grow no faster than a small share of its limit and stay under the
// memory limit the Helm chart gives its pod.

type soakOptions struct {
	// The load: how long, how many clients against how many permits,
	// each answer's length, a client's patience.
	duration, timeout        time.Duration
	clients, permits, tokens int
	// Sampling: how often; the verdict's window (the last this long of
	// the load); how long to keep sampling after it.
	interval, judge, settle time.Duration
	// cacheSize is temporal.workflow_cache_size (0: derived from the pools).
	cacheSize int
	// eventsTTL is events.ttl (and api.idempotency_ttl, which may not
	// exceed it).
	eventsTTL time.Duration
	// values is the Helm chart's values file, whose memory limits the
	// processes are held to.
	values string
	out    string
	strict bool
}

// soakScenario is the soak benchmark: its flags and what it sampled.
type soakScenario struct {
	soakOptions
	cfg    config.Config
	limits map[string]float64 // MiB, by process; absent: not in the chart
	run    *stepRun
	// loadEnd is when the load stopped, in seconds since it started.
	loadEnd float64
	mu      sync.Mutex
	samples []soakSample
	cur     atomic.Pointer[stepRun]
	phase   atomic.Value // string
}

func (s *soakScenario) Flags(fs *flag.FlagSet) {
	fs.DurationVar(&s.duration, "duration", 30*time.Minute, "how long the load runs")
	fs.IntVar(&s.permits, "permits", config.Default().Pools.Short.MaxConcurrency, "permits P of the short pool (the simulator runs P sequences at once)")
	fs.IntVar(&s.clients, "clients", 2*config.Default().Pools.Short.MaxConcurrency, "closed-loop clients: each sends its next request when the last one ended")
	fs.IntVar(&s.tokens, "max-tokens", 32, "max_tokens of each request")
	fs.DurationVar(&s.timeout, "timeout", 60*time.Second, "a client gives up on its request after this long")
	fs.DurationVar(&s.interval, "interval", 10*time.Second, "how often every process is sampled")
	fs.DurationVar(&s.judge, "judge", 20*time.Minute, "the verdict is on the last this long of the load (at most two thirds of -duration)")
	fs.DurationVar(&s.settle, "settle", 30*time.Second, "how long to keep sampling after the load stopped")
	fs.IntVar(&s.cacheSize, "workflow-cache", 0, "temporal.workflow_cache_size of the API and the worker (0: derived from the pools, 4 per permit, at least 256)")
	fs.DurationVar(&s.eventsTTL, "events-ttl", 5*time.Minute, "events.ttl (and api.idempotency_ttl): Redis holds every request's event stream this long, so its memory levels off only after it (0: the default, 1h)")
	fs.StringVar(&s.values, "values", "deploy/helm/sluice/values.yaml", "the Helm chart's values, whose api and worker memory limits the processes are held to")
	fs.StringVar(&s.out, "out", "tests/load/report", "directory of the report (soak.md, soak.csv, soak.png)")
	fs.BoolVar(&s.strict, "strict", false, "a missed goal fails the run")
}

func (s *soakScenario) Stacks() ([]stack.Options, error) {
	if s.duration <= 0 || s.interval <= 0 || s.judge <= 0 || s.settle < 0 || s.timeout <= 0 {
		return nil, errors.New("-duration, -interval, -judge and -timeout must be positive, -settle not negative")
	}
	if s.clients < 1 || s.permits < 1 || s.tokens < 1 || s.cacheSize < 0 || s.eventsTTL < 0 {
		return nil, errors.New("-clients, -permits and -max-tokens must be positive, -workflow-cache and -events-ttl not negative")
	}
	s.judge = min(s.judge, s.duration*2/3)
	if s.judge < 3*s.interval {
		return nil, fmt.Errorf("the verdict's window (%s) holds fewer than 3 samples every %s: lengthen -duration or shorten -interval", s.judge, s.interval)
	}
	var err error
	if s.limits, err = chartMemoryLimits(s.values); err != nil {
		return nil, err
	}
	return []stack.Options{{
		Processes: true,
		Quiet:     true,
		Simulator: func(sim *llmsim.Config) { sim.MaxNumSeqs = s.permits },
		Configure: func(cfg *config.Config) {
			cfg.Limits.Enabled = false
			cfg.Pools.Short.MaxConcurrency = s.permits
			if s.cacheSize > 0 {
				cfg.Temporal.WorkflowCacheSize = s.cacheSize
			}
			if s.eventsTTL > 0 {
				cfg.Events.TTL = s.eventsTTL
				cfg.API.IdempotencyTTL = min(cfg.API.IdempotencyTTL, s.eventsTTL)
			}
			cfg.API.MaxConnsPerIP = max(cfg.API.MaxConnsPerIP, s.clients+16)
			cfg.API.MaxConns = max(cfg.API.MaxConns, cfg.API.MaxConnsPerIP)
		},
	}}, nil
}

func (s *soakScenario) Drive(ctx context.Context, st *stack.Stack) error {
	s.cfg = st.Config
	smp, err := newSampler(ctx, st)
	if err != nil {
		return err
	}
	defer smp.close()
	hc := st.Client(s.clients)
	do := func(ctx context.Context, i int) chat.Result {
		body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, chat.Queries[i%len(chat.Queries)], s.tokens)
		return chat.Read(ctx, hc, st.BaseURL, body, nil)
	}
	s.phase.Store("load")
	s.run = newStepRun("soak", 0, s.duration, s.timeout)
	s.cur.Store(s.run)
	start := s.run.start
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s.sample(sctx, smp, start)
	}()
	s.run.closedLoop(ctx, s.clients, do)
	s.loadEnd = time.Since(start).Seconds()
	s.phase.Store("settle")
	s.cur.Store(nil)
	load.SleepUntil(ctx, time.Now().Add(s.settle))
	stopSampling()
	<-sampled
	// The last sample is the settled state, whatever the ticker's phase.
	s.add(smp.take(ctx, time.Since(start).Seconds()))
	return ctx.Err()
}

// sample takes a sample now and every interval until ctx ends.
func (s *soakScenario) sample(ctx context.Context, smp *sampler, start time.Time) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.add(smp.take(ctx, time.Since(start).Seconds()))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *soakScenario) add(x soakSample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, x)
}

// taken is a copy of the samples so far.
func (s *soakScenario) taken() []soakSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]soakSample(nil), s.samples...)
}

func (s *soakScenario) Status(st *stack.Stack) string {
	line := fmt.Sprintf("phase=%v", s.phase.Load())
	if r := s.cur.Load(); r != nil {
		line = r.status()
	}
	s.mu.Lock()
	var last *soakSample
	if n := len(s.samples); n > 0 {
		last = &s.samples[n-1]
	}
	s.mu.Unlock()
	if last != nil {
		for _, name := range soakProcesses {
			p := last.procs[name]
			line += fmt.Sprintf(" %s=%.0fMiB", name, p.rssMiB)
			if p.goroutines >= 0 {
				line += fmt.Sprintf("/%.0fg/%.0fc", p.goroutines, p.cache)
			}
		}
	}
	return line + " " + st.PoolsNow()
}
