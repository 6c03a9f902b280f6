package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/workflows"
)

// The burst benchmark sends many concurrent SSE clients at once against a
// small number of permits and sorts every client's fate: an answer, a
// rejected or error event, a documented 503 or a 429 — or something that
// should never happen (another 5xx, a broken stream, a hang). Afterwards
// every permit and queue place must be back, and the simulator must never
// have seen more requests at once than there are permits.

type burstOptions struct {
	clients     int
	shortPerms  int
	longPerms   int
	longEvery   int
	tenants     int
	ramp        time.Duration
	maxTokens   int
	deadline    time.Duration
	timeScale   float64
	maxStarts   int
	maxQueue    int
	drainWithin time.Duration
	fastWait    time.Duration
	maxRecheck  time.Duration
}

func defineBurst(fs *flag.FlagSet) func(context.Context) error {
	var o burstOptions
	d := config.Default()
	fs.IntVar(&o.clients, "clients", 2000, "concurrent SSE clients, one request each")
	fs.IntVar(&o.shortPerms, "short-permits", d.Pools.Short.MaxConcurrency, "permits of the short pool")
	fs.IntVar(&o.longPerms, "long-permits", d.Pools.Long.MaxConcurrency, "permits of the long pool")
	fs.IntVar(&o.longEvery, "long-every", 5, "every n-th client sends a query long enough for the long pool (0: none)")
	fs.IntVar(&o.tenants, "tenants", 20, "tenants (API keys) the clients are spread over")
	fs.DurationVar(&o.ramp, "ramp", 0, "spread the clients' starts evenly over this long (0: all at once)")
	fs.IntVar(&o.maxTokens, "max-tokens", 16, "max_tokens of each request")
	fs.DurationVar(&o.deadline, "deadline", 0, "a client without a terminal event after this long is a hang (0: admission.max_wait + 60s)")
	fs.Float64Var(&o.timeScale, "time-scale", 1, "simulator time scale (1: real time)")
	fs.IntVar(&o.maxStarts, "max-starts", d.API.MaxStartsInFlight, "api.max_starts_in_flight")
	fs.IntVar(&o.maxQueue, "max-queue", d.Admission.MaxQueueDepth, "admission.max_queue_depth")
	fs.DurationVar(&o.fastWait, "fast-wait", d.Admission.FastWait, "admission.fast_wait (0: waiters learn of grants by signal only)")
	fs.DurationVar(&o.maxRecheck, "max-recheck", d.Admission.MaxRecheckInterval, "admission.max_recheck_interval")
	fs.DurationVar(&o.drainWithin, "drain-within", time.Minute, "how long after the last client the pools may take to be idle")
	return func(ctx context.Context) error { return runBurst(ctx, o) }
}

const burstTier = "burst"

// longQuery is long enough that its prompt bound exceeds the short pool's
// routing threshold.
var longQuery = strings.Repeat("Explain how weighted fair queuing shares one pool of permits between tenants. ", 30)

func runBurst(ctx context.Context, o burstOptions) error {
	permits := o.shortPerms + o.longPerms
	sim := llmsim.DefaultConfig()
	sim.TimeScale = o.timeScale
	// The deployment is sized to its permits.
	sim.MaxNumSeqs = permits
	var keys []string
	st, err := launchStack(ctx, stackOptions{Sim: &sim, Configure: func(cfg *config.Config) {
		cfg.Pools.Short.MaxConcurrency = o.shortPerms
		cfg.Pools.Long.MaxConcurrency = o.longPerms
		cfg.API.MaxStartsInFlight = o.maxStarts
		cfg.Admission.MaxQueueDepth = o.maxQueue
		cfg.Admission.FastWait = o.fastWait
		cfg.Admission.MaxRecheckInterval = o.maxRecheck
		// The standard tier's share and caps, without its rate limits: the
		// burst is to reach the queue, not stop at the door.
		std := cfg.Limits.Tiers["standard"]
		cfg.Limits.Tiers[burstTier] = config.Tier{Weight: std.Weight, MaxWait: std.MaxWait, MaxQueuePerTenant: std.MaxQueuePerTenant}
		for t := 0; t < o.tenants; t++ {
			k := fmt.Sprintf("k-burst-%02d", t)
			keys = append(keys, k)
			cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, config.APIKey{Key: k, Tenant: fmt.Sprintf("burst-%02d", t), Tier: burstTier})
		}
	}})
	if err != nil {
		return err
	}
	defer st.Close()
	cfg := st.cfg
	maxWait := cfg.Admission.MaxWait
	if t := cfg.Limits.Tiers[burstTier]; t.MaxWait > 0 {
		maxWait = t.MaxWait
	}
	if o.deadline <= 0 {
		o.deadline = maxWait + 60*time.Second
	}
	pools := st.rt.Gate.Pools()

	// Watch what the simulator and the gate see, throughout.
	var simMax, inUseMax, waitingMax atomic.Int64
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-watchCtx.Done():
				return
			case <-t.C:
			}
			s := st.sim.Stats()
			storeMax(&simMax, int64(s.Running+s.Waiting))
			if i%10 == 0 {
				var inUse, waiting int64
				for _, p := range pools {
					if gs, err := st.rt.Gate.Stats(watchCtx, p); err == nil {
						inUse += int64(gs.InUse)
						waiting += int64(gs.Waiting)
					}
				}
				storeMax(&inUseMax, inUse)
				storeMax(&waitingMax, waiting)
			}
		}
	}()

	tr := &http.Transport{MaxIdleConns: o.clients, MaxIdleConnsPerHost: o.clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	type outcome struct {
		kind   string
		took   time.Duration
		tokens int
	}
	results := make([]outcome, o.clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < o.clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if o.ramp > 0 {
				time.Sleep(time.Duration(int64(o.ramp) * int64(i) / int64(o.clients)))
			}
			q := "How does a token bucket refill?"
			if o.longEvery > 0 && i%o.longEvery == o.longEvery-1 {
				q = longQuery
			}
			body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, q, o.maxTokens)
			cctx, cancel := context.WithTimeout(ctx, o.deadline)
			defer cancel()
			t0 := time.Now()
			kind, tokens := burstClient(cctx, hc, st.baseURL, body, keys[i%len(keys)])
			results[i] = outcome{kind: kind, took: time.Since(t0), tokens: tokens}
		}(i)
	}
	wg.Wait()
	clientsDone := time.Since(start)

	// Every permit and queue place must come back.
	idleAfter := time.Duration(-1)
	var final []admission.QueueStats
	for t0 := time.Now(); ; {
		final = final[:0]
		idle := true
		for _, p := range pools {
			qs, err := st.rt.Gate.QueueStats(ctx, p)
			if err != nil {
				return err
			}
			final = append(final, qs)
			idle = idle && qs.InUse == 0 && qs.Waiting == 0
		}
		if idle {
			idleAfter = time.Since(t0)
			break
		}
		if time.Since(t0) > o.drainWithin || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	running, err := runningChatWorkflows(ctx, st, 10*time.Second)
	if err != nil {
		return err
	}
	started, err := countChatWorkflows(ctx, st, "")
	if err != nil {
		return err
	}
	stopWatch()
	<-watched

	byKind := map[string][]outcome{}
	for _, r := range results {
		byKind[r.kind] = append(byKind[r.kind], r)
	}
	kinds := make([]string, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return len(byKind[kinds[i]]) > len(byKind[kinds[j]]) })

	ramp := "all at once"
	if o.ramp > 0 {
		ramp = fmt.Sprintf("starts spread over %v", o.ramp)
	}
	header("burst", fmt.Sprintf("%d concurrent SSE clients (POST /v1/chat, max_tokens %d, every %d-th query long), %s, %d tenants on a tier with the standard tier's weight and queue caps (max %d waiting per tenant, max_wait %v) and no rate limits; %d permits (short %d + long %d); api.max_starts_in_flight %d, admission.max_queue_depth %d; simulator time scale %g, %d sequences",
		o.clients, o.maxTokens, o.longEvery, ramp, o.tenants, cfg.Limits.Tiers[burstTier].MaxQueuePerTenant, maxWait, permits, o.shortPerms, o.longPerms,
		o.maxStarts, o.maxQueue, o.timeScale, sim.MaxNumSeqs))
	fmt.Println("| outcome | clients | share | time to outcome p50 | p99 | max |")
	fmt.Println("|---|---|---|---|---|---|")
	bad, hangs, fivexx := 0, 0, 0
	for _, k := range kinds {
		rs := byKind[k]
		ts := make([]time.Duration, len(rs))
		for i, r := range rs {
			ts[i] = r.took
		}
		l := sorted(ts)
		fmt.Printf("| %s | %d | %.1f%% | %s | %s | %s |\n", k, len(rs), 100*float64(len(rs))/float64(o.clients), ms(l.at(50)), ms(l.at(99)), ms(l.max()))
		if !acceptable(k) {
			bad += len(rs)
		}
		if k == kindHang {
			hangs += len(rs)
		}
		if strings.HasPrefix(k, "HTTP 5") && !strings.HasPrefix(k, "HTTP 503 ") {
			fivexx += len(rs)
		}
		if strings.HasPrefix(k, "HTTP 503 ") && !documented503[strings.TrimPrefix(k, "HTTP 503 ")] {
			fivexx += len(rs)
		}
	}
	fmt.Println()
	fmt.Printf("all clients finished after %s; chat workflows started: %d, still running afterwards: %d\n", ms(clientsDone), started, running)
	fmt.Printf("max seen during the run: simulator running+waiting %d, permits in use %d (both pools), waiting %d\n", simMax.Load(), inUseMax.Load(), waitingMax.Load())
	leaks := 0
	for i, p := range pools {
		fmt.Printf("pool %s afterwards: %d in use, %d waiting\n", p, final[i].InUse, final[i].Waiting)
		leaks += final[i].InUse + final[i].Waiting
	}
	idle := "never"
	if idleAfter >= 0 {
		idle = ms(idleAfter) + " after the last client"
	}
	goal("5xx other than the documented 503s (busy, queue_full, tenant_queue_full, unavailable)", fmt.Sprint(fivexx), "0", fivexx == 0)
	goal("clients without an answer, a rejected/error event, a documented 503 or a 429", fmt.Sprint(bad), "0", bad == 0)
	goal("hangs (no terminal event within "+o.deadline.String()+")", fmt.Sprint(hangs), "0", hangs == 0)
	goal("permits in use + queue places left afterwards (both pools idle: "+idle+")", fmt.Sprint(leaks), "0", leaks == 0)
	goal("most requests the simulator saw at once (running + waiting)", fmt.Sprint(simMax.Load()), fmt.Sprintf("<= %d", permits), simMax.Load() <= int64(permits))
	return nil
}

const kindHang = "hang"

var documented503 = map[string]bool{"busy": true, workflows.ReasonQueueFull: true, workflows.ReasonTenantQueueFull: true, "unavailable": true}

// acceptable says whether an outcome is one a client may get under a
// burst.
func acceptable(kind string) bool {
	switch {
	case kind == "done":
		return true
	case strings.HasPrefix(kind, "rejected "), strings.HasPrefix(kind, "error "):
		return true
	case kind == "HTTP 429 rate_limited":
		return true
	case strings.HasPrefix(kind, "HTTP 503 "):
		return documented503[strings.TrimPrefix(kind, "HTTP 503 ")]
	}
	return false
}

// burstClient runs one client's request to its end and names the outcome.
func burstClient(ctx context.Context, hc *http.Client, baseURL, body, key string) (kind string, tokens int) {
	s, err := postChat(ctx, hc, baseURL, body, map[string]string{"Authorization": "Bearer " + key})
	if err != nil {
		var he *httpError
		switch {
		case errors.As(err, &he):
			return fmt.Sprintf("HTTP %d %s", he.status, he.code), 0
		case ctx.Err() != nil:
			return kindHang, 0
		}
		return "transport error", 0
	}
	defer s.close()
	for {
		ev, err := s.next()
		if err != nil {
			if ctx.Err() != nil {
				return kindHang, tokens
			}
			return "stream ended without a terminal event", tokens
		}
		switch ev.Event {
		case events.TypeToken:
			tokens++
		case events.TypeDone:
			if tokens == 0 {
				return "done without tokens", 0
			}
			return "done", tokens
		case events.TypeRejected, events.TypeError:
			var f events.Failure
			_ = ev.Decode(&f)
			return ev.Event + " " + f.Reason, tokens
		}
	}
}

func storeMax(v *atomic.Int64, n int64) {
	for {
		cur := v.Load()
		if n <= cur || v.CompareAndSwap(cur, n) {
			return
		}
	}
}
