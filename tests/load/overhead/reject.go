package overhead

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/tests/load/internal/load"
	"github.com/sluice-dev/sluice/tests/load/internal/machine"
	"github.com/sluice-dev/sluice/tests/load/internal/progress"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
)

// The reject benchmark drives POST /v1/chat for a tenant whose request
// bucket is empty and barely refills, so that every request is refused
// with 429 at the door: first closed loop over many keep-alive connections
// (the most it can refuse), then open loop at the goal rate (its latency
// there). It checks that no workflow was started.

type rejectOptions struct {
	// The closed loop's connections and warm-up; every phase's length.
	conns            int
	warmup, duration time.Duration
	// The open-loop phases' rates and the wrk phases' connections, as
	// comma-separated lists; the control phase's rate.
	rates, wrkConns string
	control         float64
	// Where the closed loop's own CPU profile goes.
	profile string
}

func (j *rejectScenario) Flags(fs *flag.FlagSet) {
	fs.IntVar(&j.conns, "conns", 64, "keep-alive connections of the closed-loop phase (one client each)")
	fs.DurationVar(&j.warmup, "warmup", time.Second, "unmeasured closed-loop load first")
	fs.DurationVar(&j.duration, "duration", 10*time.Second, "length of each measured phase")
	fs.StringVar(&j.rates, "rates", "1000,2000,3000,4000,5000", "requests/s of the open-loop phases, one phase each (the goal is judged at 5000)")
	fs.Float64Var(&j.control, "control-rate", 2000, "requests/s of a control phase of GET /healthz through the same client and server (0: none)")
	fs.StringVar(&j.wrkConns, "wrk-conns", "8,32", "connections of the wrk phases (closed loop, one wrk thread), one phase each; skipped without wrk on PATH")
	fs.StringVar(&j.profile, "profile", "", "write a CPU profile of the closed-loop phase only")
}

// rejectScenario is the reject benchmark: its flags, its client, and each
// phase's results.
type rejectScenario struct {
	rejectOptions
	rateList  []float64
	wrkList   []int
	hc        *http.Client
	baseURL   string
	responses statusCounts
	before    int64
	after     int64
	// The closed loop: its load, responses, CPU and Go heap.
	closed          load.Result
	closedResponses map[int]int
	closedCPU       string
	mem0, mem1      runtime.MemStats
	opens           []openPhase
	wrks            []wrkPhase
	wrkSkipped      string
	controlRun      load.Result
	// prog counts the current phase's responses, for the progress line.
	prog progress.Meter
}

// openPhase is one open-loop phase.
type openPhase struct {
	rate      float64
	res       load.Result
	responses map[int]int
	cpu       string
}

// wrkPhase is one run of wrk.
type wrkPhase struct {
	conns int
	res   wrkResult
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
var floodRate = policy.Rate{RequestsPerMinute: 0.001, RequestBurst: 1}

var rejectBody = []byte(`{"query":"How does a token bucket refill?","max_tokens":64}`)

func (j *rejectScenario) Stacks() ([]stack.Options, error) {
	var err error
	if j.rateList, err = scenario.Positives("rates", "rate", j.rates, scenario.ParseFloat); err != nil {
		return nil, err
	}
	if j.wrkList, err = scenario.Positives("wrk-conns", "count", j.wrkConns, strconv.Atoi); err != nil {
		return nil, err
	}
	return []stack.Options{{Configure: func(cfg *config.Config) {
		cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, config.APIKey{Key: floodKey, Tenant: floodTenant, User: "flood-user", Tier: floodTier})
		cfg.Limits.Tiers[floodTier] = policy.Tier{Weight: 1, Tenant: floodRate}
	}}}, nil
}

func (j *rejectScenario) Drive(ctx context.Context, st *stack.Stack) error {
	j.prog.Enter("prepare", -1)
	if err := j.prepare(ctx, st); err != nil {
		return err
	}
	j.prog.Enter("warm-up", 0)
	load.ClosedLoop(ctx, j.warmup, j.conns, j.postAs)
	j.responses.take()
	if err := j.measureClosed(ctx); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, rate := range j.rateList {
		j.prog.Enter(fmt.Sprintf("open-%.0f/s", rate), int64(rate*j.duration.Seconds()))
		c0 := machine.TakeCPU()
		// Enough workers that the open loop is never short of a free one.
		res := load.Paced(ctx, rate, j.duration, max(j.conns, 256), func(ctx context.Context, _, _ int) error { return j.postAs(ctx, 0) })
		j.opens = append(j.opens, openPhase{rate: rate, res: res, responses: j.responses.take(), cpu: machine.CPUBetween(c0, machine.TakeCPU())})
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	j.runWrk(ctx)
	if j.control > 0 {
		j.prog.Enter("control-healthz", int64(j.control*j.duration.Seconds()))
		j.controlRun = load.Paced(ctx, j.control, j.duration, max(j.conns, 256), j.getHealth)
	}
	// Visibility lags a little behind starts; a workflow started by a
	// refused request would show up within this.
	j.prog.Enter("count-workflows", -1)
	time.Sleep(2 * time.Second)
	var err error
	j.after, err = stack.CountChatWorkflows(ctx, st, "")
	return err
}

func (j *rejectScenario) Status(*stack.Stack) string {
	return j.prog.String()
}

// prepare drains the flood tenant's bucket and checks that its first
// request through the API is refused.
func (j *rejectScenario) prepare(ctx context.Context, st *stack.Stack) error {
	// Drain the tenant's bucket from here, with the bucket the API
	// computes, so that not even the first request passes.
	buckets := limiter.Policy{Tenant: limiter.Rate{RequestsPerMinute: floodRate.RequestsPerMinute, RequestBurst: floodRate.RequestBurst}}.
		Buckets(limiter.Caller{Tenant: floodTenant}, 1)
	if d, err := st.Core.Limiter.Reserve(ctx, "bench-drain", buckets); err != nil || d.Status != limiter.Allowed {
		return fmt.Errorf("drain the flood tenant's bucket: %+v %v", d, err)
	}
	var err error
	if j.before, err = stack.CountChatWorkflows(ctx, st, ""); err != nil {
		return err
	}
	j.hc, j.baseURL = st.Client(4096), st.BaseURL
	if code, err := j.post(ctx); err != nil || code != http.StatusTooManyRequests {
		return fmt.Errorf("first request: status %d, %v; want 429", code, err)
	}
	return nil
}

// post sends the flood tenant's chat request and counts its response.
func (j *rejectScenario) post(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.baseURL+"/v1/chat", bytes.NewReader(rejectBody))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+floodKey)
	resp, err := j.hc.Do(req)
	if err != nil {
		j.prog.Fail()
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	j.responses.add(resp.StatusCode)
	j.prog.Add(1)
	return resp.StatusCode, nil
}

func (j *rejectScenario) postAs(ctx context.Context, _ int) error {
	_, err := j.post(ctx)
	return err
}

// getHealth is the cheapest route through the same client and server:
// what the HTTP stack and the shared cores cost by themselves.
func (j *rejectScenario) getHealth(ctx context.Context, _, _ int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.baseURL+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := j.hc.Do(req)
	if err != nil {
		j.prog.Fail()
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	j.prog.Add(1)
	return nil
}

// measureClosed runs the measured closed loop, under the phase's own CPU
// profile if asked.
func (j *rejectScenario) measureClosed(ctx context.Context) error {
	if j.profile != "" {
		f, err := os.Create(j.profile)
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
	j.prog.Enter("closed", 0)
	runtime.ReadMemStats(&j.mem0)
	cpu0 := machine.TakeCPU()
	j.closed = load.ClosedLoop(ctx, j.duration, j.conns, j.postAs)
	j.closedCPU = machine.CPUBetween(cpu0, machine.TakeCPU())
	runtime.ReadMemStats(&j.mem1)
	if j.profile != "" {
		pprof.StopCPUProfile()
	}
	j.closedResponses = j.responses.take()
	return nil
}

// runWrk sends the same requests from wrk: a client that leaves the
// server the cores.
func (j *rejectScenario) runWrk(ctx context.Context) {
	for _, n := range j.wrkList {
		j.prog.Enter(fmt.Sprintf("wrk-%dconns", n), -1)
		res, err := runWrk(ctx, j.baseURL+"/v1/chat", string(rejectBody), floodKey, n, j.duration)
		if err != nil {
			j.wrkSkipped = err.Error()
			return
		}
		j.wrks = append(j.wrks, wrkPhase{n, res})
	}
}

func (j *rejectScenario) Report(r *report.Report) error {
	r.Header(fmt.Sprintf("POST /v1/chat by a tenant whose request bucket is drained (capacity 1, refill %g/min), from the bench's HTTP client in the API's process; closed loop over %d keep-alive connections for %v after %v warm-up, then open loop at each of %s requests/s for %v",
		floodRate.RequestsPerMinute, j.conns, j.duration, j.warmup, j.rates, j.duration))
	j.phaseTable(r)
	r.Linef("")
	if j.wrkSkipped != "" {
		r.Linef("wrk phases skipped: %s (apt-get install wrk)", j.wrkSkipped)
	}
	r.Linef("closed loop: responses %s, transport errors %d\n  CPU: %s", byStatus(j.closedResponses), j.closed.Errs, j.closedCPU)
	r.Linef("  Go heap: %.1f KiB allocated per request (client and server together), %d GC cycles in %v",
		float64(j.mem1.TotalAlloc-j.mem0.TotalAlloc)/float64(max(len(j.closed.Lat), 1))/1024, j.mem1.NumGC-j.mem0.NumGC, j.closed.Elapsed.Round(time.Second))
	best := 0.0
	for _, p := range j.opens {
		r.Linef("open loop at %s: responses %s, transport errors %d, %d sent over 1 ms late because all workers were busy\n  CPU: %s",
			stats.PerSecond(p.rate), byStatus(p.responses), p.res.Errs, p.res.Late, p.cpu)
		if p.res.Lat.At(99) <= 10*time.Millisecond && not429(p.responses) == 0 && p.rate > best {
			best = p.rate
		}
	}
	r.Linef("highest open-loop rate with p99 <= 10 ms and nothing but 429s: %s", stats.PerSecond(best))
	j.goals(r)
	return nil
}

// phaseTable adds a row per phase.
func (j *rejectScenario) phaseTable(r *report.Report) {
	r.Table("phase", "requests/s", "p50", "p90", "p99", "p99.9", "max", "not 429")
	row := func(what string, rate float64, l stats.Latencies, not429 string) {
		r.Row(what, stats.PerSecond(rate), stats.Ms(l.At(50)), stats.Ms(l.At(90)), stats.Ms(l.At(99)), stats.Ms(l.At(99.9)), stats.Ms(l.Max()), not429)
	}
	row(fmt.Sprintf("closed loop, %d connections", j.conns), j.closed.Rate(), j.closed.Lat, fmt.Sprint(not429(j.closedResponses)+j.closed.Errs))
	for _, p := range j.opens {
		row("open loop at "+stats.PerSecond(p.rate), p.res.SentRate(), p.res.Lat, fmt.Sprint(not429(p.responses)+p.res.Errs))
	}
	if j.control > 0 {
		row("control: GET /healthz, open loop at "+stats.PerSecond(j.control), j.controlRun.SentRate(), j.controlRun.Lat, "—")
	}
	for _, w := range j.wrks {
		r.Row(fmt.Sprintf("wrk, closed loop, %d connections", w.conns), stats.PerSecond(w.res.rps), stats.Ms(w.res.p50), stats.Ms(w.res.p90), stats.Ms(w.res.p99), "—", "—", fmt.Sprint(w.res.not429))
	}
}

func (j *rejectScenario) goals(r *report.Report) {
	closedRate, closedNot429 := j.closed.Rate(), not429(j.closedResponses)
	r.Goal("rejections/s, closed loop (all 429)", fmt.Sprintf("%s, %d not 429", stats.PerSecond(closedRate), closedNot429), ">= 5,000/s", closedRate >= 5000 && closedNot429 == 0)
	for _, p := range j.opens {
		if p.rate == goalRejectRate {
			rate := p.res.SentRate()
			r.Goal(fmt.Sprintf("p99 at %s, open loop", stats.PerSecond(rate)), stats.Ms(p.res.Lat.At(99)), "<= 10 ms", p.res.Lat.At(99) <= 10*time.Millisecond && rate >= 0.95*p.rate)
		}
	}
	r.Goal("p99 of the closed loop", stats.Ms(j.closed.Lat.At(99)), "<= 10 ms", j.closed.Lat.At(99) <= 10*time.Millisecond)
	for _, w := range j.wrks {
		r.Goal(fmt.Sprintf("wrk, %d connections: rejections/s and p99", w.conns), fmt.Sprintf("%s, p99 %s, %d not 429 %s", stats.PerSecond(w.res.rps), stats.Ms(w.res.p99), w.res.not429, w.res.errors),
			">= 5,000/s with p99 <= 10 ms", w.res.rps >= 5000 && w.res.p99 <= 10*time.Millisecond && w.res.not429 == 0)
	}
	r.Goal("chat workflows started", fmt.Sprint(j.after-j.before), "0", j.after == j.before)
}

// statusCounts counts responses by HTTP status, phase by phase.
type statusCounts struct {
	mu sync.Mutex
	m  map[int]int
}

func (c *statusCounts) add(status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[int]int{}
	}
	c.m[status]++
}

// take returns the counts so far and starts from zero.
func (c *statusCounts) take() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.m
	c.m = nil
	if m == nil {
		m = map[int]int{}
	}
	return m
}

// not429 counts the responses other than 429.
func not429(m map[int]int) int {
	n := 0
	for c, k := range m {
		if c != http.StatusTooManyRequests {
			n += k
		}
	}
	return n
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
		parts = append(parts, fmt.Sprintf("%d×%s", c, stats.Thousands(int64(m[c]))))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}
