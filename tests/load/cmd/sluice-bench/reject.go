package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.temporal.io/api/workflowservice/v1"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/workflows"
)

// The reject benchmark drives POST /v1/chat for a tenant whose request
// bucket is empty and barely refills, so that every request is refused
// with 429 at the door: first closed loop over many keep-alive connections
// (the most it can refuse), then open loop at the goal rate (its latency
// there). It checks that no workflow was started.

type rejectOptions struct {
	conns    int
	duration time.Duration
	warmup   time.Duration
	rates    string
	control  float64
	profile  string
	wrkConns string
}

func defineReject(fs *flag.FlagSet) func(context.Context) error {
	var o rejectOptions
	fs.IntVar(&o.conns, "conns", 64, "keep-alive connections of the closed-loop phase (one client each)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measured phase")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured closed-loop load first")
	fs.StringVar(&o.rates, "rates", "1000,2000,3000,4000,5000", "requests/s of the open-loop phases, one phase each (the goal is judged at 5000)")
	fs.Float64Var(&o.control, "control-rate", 2000, "requests/s of a control phase of GET /healthz through the same client and server (0: none)")
	fs.StringVar(&o.wrkConns, "wrk-conns", "8,32", "connections of the wrk phases (closed loop, one wrk thread), one phase each; skipped without wrk on PATH")
	fs.StringVar(&o.profile, "profile", "", "write a CPU profile of the closed-loop phase only")
	return func(ctx context.Context) error { return runReject(ctx, o) }
}

// goalRejectRate is the rate the 429 path must sustain with p99 <= 10 ms.
const goalRejectRate = 5000

const (
	floodKey    = "k-flood"
	floodTenant = "flood"
	floodTier   = "flood"
)

// floodRate is a bucket of one request that refills one request every
// 1,000 minutes: once drained, it refuses everything for the whole run.
var floodRate = config.Rate{RequestsPerMinute: 0.001, RequestBurst: 1}

func runReject(ctx context.Context, o rejectOptions) error {
	st, err := launchStack(ctx, stackOptions{Configure: func(cfg *config.Config) {
		cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, config.APIKey{Key: floodKey, Tenant: floodTenant, User: "flood-user", Tier: floodTier})
		cfg.Limits.Tiers[floodTier] = config.Tier{Weight: 1, Tenant: floodRate}
	}})
	if err != nil {
		return err
	}
	defer st.Close()

	// Drain the tenant's bucket from here, with the bucket the API
	// computes, so that not even the first request passes.
	buckets := limiter.Policy{Tenant: limiter.Rate{RequestsPerMinute: floodRate.RequestsPerMinute, RequestBurst: floodRate.RequestBurst}}.
		Buckets(limiter.Caller{Tenant: floodTenant}, 1)
	if d, err := st.rt.Limiter.Reserve(ctx, "bench-drain", buckets); err != nil || d.Status != limiter.Allowed {
		return fmt.Errorf("drain the flood tenant's bucket: %+v %v", d, err)
	}
	before, err := countChatWorkflows(ctx, st, "")
	if err != nil {
		return err
	}

	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	body := []byte(`{"query":"How does a token bucket refill?","max_tokens":64}`)
	var statusMu sync.Mutex
	statuses := map[int]int{}
	post := func(ctx context.Context) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.baseURL+"/v1/chat", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+floodKey)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statusMu.Lock()
		statuses[resp.StatusCode]++
		statusMu.Unlock()
		return resp.StatusCode, nil
	}
	if code, err := post(ctx); err != nil || code != http.StatusTooManyRequests {
		return fmt.Errorf("first request: status %d, %v; want 429", code, err)
	}

	closedLoop := func(d time.Duration) ([]time.Duration, int, time.Duration) {
		var mu sync.Mutex
		var all []time.Duration
		errs := 0
		var wg sync.WaitGroup
		start := time.Now()
		deadline := start.Add(d)
		for c := 0; c < o.conns; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lat := make([]time.Duration, 0, 4096)
				e := 0
				for time.Now().Before(deadline) && ctx.Err() == nil {
					t0 := time.Now()
					if _, err := post(ctx); err != nil {
						e++
						continue
					}
					lat = append(lat, time.Since(t0))
				}
				mu.Lock()
				all = append(all, lat...)
				errs += e
				mu.Unlock()
			}()
		}
		wg.Wait()
		return all, errs, time.Since(start)
	}
	closedLoop(o.warmup)
	statusMu.Lock()
	clear(statuses)
	statusMu.Unlock()

	if o.profile != "" {
		f, err := os.Create(o.profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "sluice-bench reject: no phase profile:", err)
		} else {
			defer pprof.StopCPUProfile()
		}
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := takeCPU()
	closed, closedErrs, closedElapsed := closedLoop(o.duration)
	cpu1 := takeCPU()
	runtime.ReadMemStats(&ms1)
	if o.profile != "" {
		pprof.StopCPUProfile()
	}
	statusMu.Lock()
	closedStatuses := maps.Clone(statuses)
	clear(statuses)
	statusMu.Unlock()
	closedLat := sorted(closed)
	closedRate := float64(len(closed)) / closedElapsed.Seconds()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	type openPhase struct {
		rate     float64
		res      pacedResult
		statuses map[int]int
		cpu      string
	}
	var opens []openPhase
	for _, f := range strings.Split(o.rates, ",") {
		rate, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || rate <= 0 {
			return fmt.Errorf("-rates: bad rate %q", f)
		}
		c0 := takeCPU()
		// Enough workers that the open loop is never short of a free one.
		res := paced(ctx, rate, o.duration, max(o.conns, 256), func(ctx context.Context, _, _ int) error {
			_, err := post(ctx)
			return err
		})
		c1 := takeCPU()
		statusMu.Lock()
		opens = append(opens, openPhase{rate: rate, res: res, statuses: maps.Clone(statuses), cpu: cpuBetween(c0, c1)})
		clear(statuses)
		statusMu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	// The same requests from wrk: a client that leaves the server the
	// cores.
	type wrkPhase struct {
		conns int
		res   wrkResult
	}
	var wrks []wrkPhase
	wrkSkipped := ""
	for _, f := range strings.Split(o.wrkConns, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-wrk-conns: bad count %q", f)
		}
		res, err := runWrk(ctx, st.baseURL+"/v1/chat", string(body), floodKey, n, o.duration)
		if err != nil {
			wrkSkipped = err.Error()
			break
		}
		wrks = append(wrks, wrkPhase{n, res})
	}

	// The same client, server and pacing on the cheapest route: what the
	// HTTP stack and the shared cores cost by themselves.
	var control pacedResult
	if o.control > 0 {
		control = paced(ctx, o.control, o.duration, max(o.conns, 256), func(ctx context.Context, _, _ int) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, st.baseURL+"/healthz", nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil
		})
	}

	// Visibility lags a little behind starts; a workflow started by a
	// refused request would show up within this.
	time.Sleep(2 * time.Second)
	after, err := countChatWorkflows(ctx, st, "")
	if err != nil {
		return err
	}

	header("reject", fmt.Sprintf("POST /v1/chat by a tenant whose request bucket is drained (capacity 1, refill %g/min), from the bench's HTTP client in the API's process; closed loop over %d keep-alive connections for %v after %v warm-up, then open loop at each of %s requests/s for %v",
		floodRate.RequestsPerMinute, o.conns, o.duration, o.warmup, o.rates, o.duration))
	fmt.Println("| phase | requests/s | p50 | p90 | p99 | p99.9 | max | not 429 |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	not429 := func(m map[int]int) int {
		n := 0
		for c, k := range m {
			if c != http.StatusTooManyRequests {
				n += k
			}
		}
		return n
	}
	fmt.Printf("| closed loop, %d connections | %s | %s | %s | %s | %s | %s | %d |\n", o.conns, perSecond(closedRate),
		ms(closedLat.at(50)), ms(closedLat.at(90)), ms(closedLat.at(99)), ms(closedLat.at(99.9)), ms(closedLat.max()), not429(closedStatuses)+closedErrs)
	for _, p := range opens {
		fmt.Printf("| open loop at %s | %s | %s | %s | %s | %s | %s | %d |\n", perSecond(p.rate), perSecond(float64(p.res.sent)/p.res.elapsed.Seconds()),
			ms(p.res.lat.at(50)), ms(p.res.lat.at(90)), ms(p.res.lat.at(99)), ms(p.res.lat.at(99.9)), ms(p.res.lat.max()), not429(p.statuses)+p.res.errs)
	}
	if o.control > 0 {
		fmt.Printf("| control: GET /healthz, open loop at %s | %s | %s | %s | %s | %s | %s | — |\n", perSecond(o.control), perSecond(float64(control.sent)/control.elapsed.Seconds()),
			ms(control.lat.at(50)), ms(control.lat.at(90)), ms(control.lat.at(99)), ms(control.lat.at(99.9)), ms(control.lat.max()))
	}
	for _, w := range wrks {
		fmt.Printf("| wrk, closed loop, %d connections | %s | %s | %s | %s | — | — | %d |\n", w.conns, perSecond(w.res.rps),
			ms(w.res.p50), ms(w.res.p90), ms(w.res.p99), w.res.not429)
	}
	fmt.Println()
	if wrkSkipped != "" {
		fmt.Printf("wrk phases skipped: %s (apt-get install wrk)\n", wrkSkipped)
	}
	fmt.Printf("closed loop: responses %s, transport errors %d\n  CPU: %s\n", byStatus(closedStatuses), closedErrs, cpuBetween(cpu0, cpu1))
	fmt.Printf("  Go heap: %.1f KiB allocated per request (client and server together), %d GC cycles in %v\n",
		float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(max(len(closed), 1))/1024, ms1.NumGC-ms0.NumGC, closedElapsed.Round(time.Second))
	best := 0.0
	for _, p := range opens {
		fmt.Printf("open loop at %s: responses %s, transport errors %d, %d sent over 1 ms late because all workers were busy\n  CPU: %s\n",
			perSecond(p.rate), byStatus(p.statuses), p.res.errs, p.res.late, p.cpu)
		if p.res.lat.at(99) <= 10*time.Millisecond && not429(p.statuses) == 0 && p.rate > best {
			best = p.rate
		}
	}
	fmt.Printf("highest open-loop rate with p99 <= 10 ms and nothing but 429s: %s\n", perSecond(best))
	goal("rejections/s, closed loop (all 429)", fmt.Sprintf("%s, %d not 429", perSecond(closedRate), not429(closedStatuses)), ">= 5,000/s", closedRate >= 5000 && not429(closedStatuses) == 0)
	for _, p := range opens {
		if p.rate == goalRejectRate {
			rate := float64(p.res.sent) / p.res.elapsed.Seconds()
			goal(fmt.Sprintf("p99 at %s, open loop", perSecond(rate)), ms(p.res.lat.at(99)), "<= 10 ms", p.res.lat.at(99) <= 10*time.Millisecond && rate >= 0.95*p.rate)
		}
	}
	goal("p99 of the closed loop", ms(closedLat.at(99)), "<= 10 ms", closedLat.at(99) <= 10*time.Millisecond)
	for _, w := range wrks {
		goal(fmt.Sprintf("wrk, %d connections: rejections/s and p99", w.conns), fmt.Sprintf("%s, p99 %s, %d not 429 %s", perSecond(w.res.rps), ms(w.res.p99), w.res.not429, w.res.errors),
			">= 5,000/s with p99 <= 10 ms", w.res.rps >= 5000 && w.res.p99 <= 10*time.Millisecond && w.res.not429 == 0)
	}
	goal("chat workflows started", fmt.Sprint(after-before), "0", after == before)
	return nil
}

// runningChatWorkflows waits up to within for no chat workflow to be
// running (visibility trails completion a little) and returns how many
// still are.
func runningChatWorkflows(ctx context.Context, st *stack, within time.Duration) (int64, error) {
	deadline := time.Now().Add(within)
	for {
		n, err := countChatWorkflows(ctx, st, "ExecutionStatus = 'Running'")
		if err != nil {
			return 0, err
		}
		if n == 0 || time.Now().After(deadline) {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// byStatus lists response counts by HTTP status.
func byStatus(m map[int]int) string {
	codes := make([]int, 0, len(m))
	for c := range m {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	parts := make([]string, 0, len(codes))
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d×%s", c, thousands(int64(m[c]))))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// countChatWorkflows counts the chat workflows the server knows of that
// match a visibility condition ("" for all, open or closed).
func countChatWorkflows(ctx context.Context, st *stack, where string) (int64, error) {
	q := fmt.Sprintf("WorkflowType = '%s'", workflows.ChatWorkflowName)
	if where != "" {
		q += " AND " + where
	}
	resp, err := st.rt.Temporal.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{
		Namespace: st.cfg.Temporal.Namespace, Query: q,
	})
	if err != nil {
		return 0, fmt.Errorf("count chat workflows (%s): %w", q, err)
	}
	return resp.GetCount(), nil
}
