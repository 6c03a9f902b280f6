package overhead

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/tests/load/internal/load"
	"github.com/sluice-dev/sluice/tests/load/internal/machine"
	"github.com/sluice-dev/sluice/tests/load/internal/progress"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/scenario"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
)

// The limiter benchmark measures the token-bucket decision at the door:
// limiter.Reserve (one EVALSHA charging three buckets) from C clients, each
// on its own connection, against redis-benchmark's SET from as many
// clients on the same redis-server in the same run; then the latency of
// Reserve at half the throughput it reached, open loop.

type limiterOptions struct {
	// The clients, and the coalescing limiters they share.
	clients, openers, instances, batchers int
	// Each phase's length, the SET baseline's size, the extra open-loop
	// rates.
	duration time.Duration
	setN     int
	sweep    string
	// The decisions: how many callers they are spread over, what each
	// charges.
	callers int
	cost    float64
}

func (l *limiterScenario) Flags(fs *flag.FlagSet) {
	fs.IntVar(&l.clients, "c", 50, "concurrent clients, each on its own connection (also redis-benchmark -c)")
	fs.IntVar(&l.openers, "open-clients", 50, "clients (connections) of the open-loop phase, at most -c; requests are dealt to them in turn")
	fs.IntVar(&l.instances, "instances", 2, "limiter instances of the coalesced runs (API processes), the -c clients spread over them")
	fs.IntVar(&l.batchers, "batchers", 2, "batchers per coalescing limiter (limiter.Options.Batchers, as app.Build sets it)")
	fs.DurationVar(&l.duration, "duration", 10*time.Second, "length of each limiter phase (closed loop, then open loop)")
	fs.IntVar(&l.setN, "set-n", 1000000, "requests of the redis-benchmark SET run (-n)")
	fs.StringVar(&l.sweep, "sweep", "1000,2000,4000", "decisions/s of extra open-loop phases (coalesced), to show where the tail stays short; empty for none")
	fs.IntVar(&l.callers, "callers", 20000, "distinct callers (tenant = caller/10, user, IP) the decisions are spread over")
	fs.Float64Var(&l.cost, "cost", 600, "tokens each request is charged (prompt + max output)")
}

// limiterScenario is the limiter benchmark: its flags, its limiters and
// connections, and each phase's results.
type limiterScenario struct {
	limiterOptions
	sweepRates []float64
	admin      *redis.Client
	// lims are one limiter per client over a connection of its own;
	// coalesced are the limiters of the coalesced runs; conns are the
	// clients' connections.
	lims, coalesced []*limiter.Limiter
	conns           []*redis.Client
	// seq numbers the decisions; allowed and limited count them.
	seq, allowed, limited atomic.Int64
	// The SET baseline, and redis-server's CPU and time per call in it.
	set     setResult
	setCPU  time.Duration
	setUsec float64
	// The closed loops: one script call per decision, then coalesced.
	one, co closedRun
	// The open loop at half the coalesced rate and its control of plain
	// SETs, with the CPU of each; Redis during the open loop: keys
	// expired, stalls, its own time per script call.
	open, control        load.Result
	openCPU, ctrlCPU     string
	expBefore, expAfter  map[string]float64
	stalls               string
	scriptP50, scriptP99 string
	// The extra open-loop phases of -sweep.
	sweeps []sweepPhase
	// prog counts the current phase's decisions (or SETs), for the
	// progress line.
	prog progress.Meter
}

// closedRun is a closed-loop phase and what Redis did during it.
type closedRun struct {
	load     load.Result
	calls    int64 // script calls Redis ran
	evalUsec float64
	redisCPU float64 // share of a core
	cpu      string
}

// sweepPhase is one extra open-loop phase.
type sweepPhase struct {
	rate float64
	res  load.Result
}

func (l *limiterScenario) Stacks() ([]stack.Options, error) {
	if n := len(benchPolicy.Buckets(callerOf(0), l.cost)); n != 3 {
		return nil, fmt.Errorf("bench policy has %d buckets, want 3", n)
	}
	var err error
	if l.sweepRates, err = scenario.Positives("sweep", "rate", l.sweep, scenario.ParseFloat); err != nil {
		return nil, err
	}
	if l.openers <= 0 || l.openers > l.clients {
		l.openers = l.clients
	}
	return []stack.Options{{RedisOnly: true}}, nil
}

// benchPolicy is a realistic three-bucket policy: the tenant's and the
// user's tokens per minute, and requests per minute per client IP (the
// standard tier's rates).
var benchPolicy = limiter.Policy{
	Tenant: limiter.Rate{TokensPerMinute: 200000},
	User:   limiter.Rate{TokensPerMinute: 60000},
	IP:     limiter.Rate{RequestsPerMinute: 600},
}

func callerOf(i int) limiter.Caller {
	return limiter.Caller{
		Tenant: "tenant-" + strconv.Itoa(i/10),
		User:   "user-" + strconv.Itoa(i),
		IP:     fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
	}
}

func (l *limiterScenario) Drive(ctx context.Context, st *stack.Stack) error {
	l.admin = redis.NewClient(&redis.Options{Addr: st.Redis.Addr})
	defer l.admin.Close()
	l.prog.Enter("redis-benchmark-set", -1)
	if err := l.measureSET(ctx, st.Redis.Addr); err != nil {
		return err
	}
	closeAll, err := l.connect(ctx, st.Redis.Addr)
	defer closeAll()
	if err != nil {
		return err
	}
	// Load the script on every connection's server side once (EVALSHA
	// falls back to EVAL on the first call only).
	if err := l.reserve(ctx, l.lims[0]); err != nil {
		return err
	}
	l.prog.Enter("closed-one-call-per-decision", 0)
	l.one = l.closedRun(ctx, func(client int) *limiter.Limiter { return l.lims[client] })
	l.prog.Enter("closed-coalesced", 0)
	l.co = l.closedRun(ctx, func(client int) *limiter.Limiter { return l.coalesced[client%len(l.coalesced)] })
	if ctx.Err() != nil {
		return ctx.Err()
	}
	l.openLoop(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, rate := range l.sweepRates {
		l.prog.Enter(fmt.Sprintf("sweep-%.0f/s", rate), int64(rate*l.duration.Seconds()))
		res := load.Paced(ctx, rate, l.duration, l.openers, l.reserveShared)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.sweeps = append(l.sweeps, sweepPhase{rate, res})
	}
	return nil
}

func (l *limiterScenario) Status(*stack.Stack) string {
	return fmt.Sprintf("%s allowed=%d limited=%d", l.prog.String(), l.allowed.Load(), l.limited.Load())
}

// measureSET runs redis-benchmark's SET on the server: the baseline.
func (l *limiterScenario) measureSET(ctx context.Context, addr string) error {
	_ = l.admin.ConfigResetStat(ctx).Err()
	cpu0 := redisCPU(ctx, l.admin)
	var err error
	if l.set, err = redisBenchmarkSET(ctx, addr, l.setN, l.clients); err != nil {
		return err
	}
	l.setCPU = redisCPU(ctx, l.admin) - cpu0
	l.setUsec = usecPerCall(ctx, l.admin, "set")
	return nil
}

// connect makes one limiter per client, each over a client with a single
// connection (C clients are C connections, as C API instances would be),
// and the coalescing limiters, as the API runs them: a few instances,
// each with its batchers over a connection pool, shared by all callers.
// The function it returns closes them all.
func (l *limiterScenario) connect(ctx context.Context, addr string) (func(), error) {
	var closers []func() error
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}
	_ = l.admin.ConfigResetStat(ctx).Err()
	l.lims = make([]*limiter.Limiter, l.clients)
	l.conns = make([]*redis.Client, l.clients)
	for i := range l.lims {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MinIdleConns: 1})
		closers = append(closers, c.Close)
		if err := c.Ping(ctx).Err(); err != nil {
			return closeAll, err
		}
		l.conns[i] = c
		l.lims[i] = limiter.New(c, limiter.Options{KeyPrefix: "bench:", ReservationTTL: 5 * time.Minute})
	}
	l.coalesced = make([]*limiter.Limiter, max(l.instances, 1))
	for i := range l.coalesced {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: l.batchers + 2})
		closers = append(closers, c.Close)
		l.coalesced[i] = limiter.New(c, limiter.Options{KeyPrefix: "bench:", ReservationTTL: 5 * time.Minute, Batchers: l.batchers, MaxBatch: 64})
		closers = append(closers, func() error { l.coalesced[i].Close(); return nil })
	}
	return closeAll, nil
}

// reserve makes one decision with lim for the next caller.
func (l *limiterScenario) reserve(ctx context.Context, lim *limiter.Limiter) error {
	n := l.seq.Add(1)
	caller := callerOf(int(n % int64(l.callers)))
	d, err := lim.Reserve(ctx, "r"+strconv.FormatInt(n, 36), benchPolicy.Buckets(caller, l.cost))
	if err != nil {
		l.prog.Fail()
		return err
	}
	l.prog.Add(1)
	if d.Status == limiter.Allowed {
		l.allowed.Add(1)
	} else {
		l.limited.Add(1)
	}
	return nil
}

// reserveShared is an open-loop worker's decision with the coalescing
// limiters.
func (l *limiterScenario) reserveShared(ctx context.Context, worker, _ int) error {
	return l.reserve(ctx, l.coalesced[worker%len(l.coalesced)])
}

// closedRun runs the closed loop with each client's limiter from pick.
func (l *limiterScenario) closedRun(ctx context.Context, pick func(client int) *limiter.Limiter) closedRun {
	_ = l.admin.ConfigResetStat(ctx).Err()
	cpu0 := redisCPU(ctx, l.admin)
	snap0 := machine.TakeCPU()
	load := load.ClosedLoop(ctx, l.duration, l.clients, func(ctx context.Context, c int) error { return l.reserve(ctx, pick(c)) })
	return closedRun{
		load: load, calls: int64(cmdStat(ctx, l.admin, "evalsha", "calls")), evalUsec: usecPerCall(ctx, l.admin, "evalsha"),
		redisCPU: (redisCPU(ctx, l.admin) - cpu0).Seconds() / load.Elapsed.Seconds(), cpu: machine.CPUBetween(snap0, machine.TakeCPU()),
	}
}

// openLoop runs the coalesced limiters at half the closed loop's rate,
// with Redis's own record of its stalls, then a control of plain SETs.
func (l *limiterScenario) openLoop(ctx context.Context) {
	half := l.co.load.Rate() / 2
	// Redis's own record of stalls of 1 ms or more, by cause, and of the
	// time it spends expiring keys, for the latency phase.
	_ = l.admin.ConfigSet(ctx, "latency-monitor-threshold", "1").Err()
	_ = l.admin.Do(ctx, "LATENCY", "RESET").Err()
	_ = l.admin.ConfigResetStat(ctx).Err() // and with it the command latency histograms
	l.expBefore = infoFields(ctx, l.admin, "stats", "expired_keys", "expire_cycle_cpu_milliseconds")
	snap := machine.TakeCPU()
	l.prog.Enter("open-half", int64(half*l.duration.Seconds()))
	l.open = load.Paced(ctx, half, l.duration, l.openers, l.reserveShared)
	if ctx.Err() != nil {
		return
	}
	l.openCPU = machine.CPUBetween(snap, machine.TakeCPU())
	l.expAfter = infoFields(ctx, l.admin, "stats", "expired_keys", "expire_cycle_cpu_milliseconds")
	l.stalls = latencyLatest(ctx, l.admin)
	l.scriptP99, l.scriptP50 = commandPercentile(ctx, l.admin, "evalsha", 99), commandPercentile(ctx, l.admin, "evalsha", 50)
	// The same open-loop harness issuing plain SETs at the same rate: what
	// the client, the Go runtime and the shared cores add by themselves.
	snap = machine.TakeCPU()
	l.prog.Enter("control-set", int64(half*l.duration.Seconds()))
	l.control = load.Paced(ctx, half, l.duration, l.openers, func(ctx context.Context, w, i int) error {
		err := l.conns[w].Set(ctx, "bench:set:"+strconv.Itoa(i%100000), "x", 0).Err()
		if err != nil {
			l.prog.Fail()
		} else {
			l.prog.Add(1)
		}
		return err
	})
	l.ctrlCPU = machine.CPUBetween(snap, machine.TakeCPU())
}

func (l *limiterScenario) Report(r *report.Report) error {
	r.Header(fmt.Sprintf("limiter.Reserve (EVALSHA of reserve.lua, 3 buckets: tenant tokens, user tokens, IP requests; %d callers) from %d clients, %v per phase: one script call per decision (%d limiters, a connection each), then coalesced as the API runs it (%d limiters, %d batchers each); redis-benchmark SET -n %d -c %d on the same redis-server, same run",
		l.callers, l.clients, l.duration, l.clients, len(l.coalesced), l.batchers, l.setN, l.clients))
	l.phaseTable(r)
	r.Linef("")
	total := l.allowed.Load() + l.limited.Load()
	r.Linef("decisions: %d (%.1f%% allowed, the rest refused by a bucket), errors %d; open loop: %d of %d sent over 1 ms late because their client was still busy",
		total, 100*float64(l.allowed.Load())/float64(max(total, 1)), l.one.load.Errs+l.co.load.Errs+l.open.Errs, l.open.Late, l.open.Sent)
	r.Linef("redis-server: SET %.1f µs per call inside Redis, %.0f%% of a core during redis-benchmark", l.setUsec, 100*l.setCPU.Seconds()/l.set.elapsed.Seconds())
	for _, run := range []struct {
		what string
		run  closedRun
	}{{"one call per decision", l.one}, {"coalesced", l.co}} {
		decisions := run.run.load.Rate() * l.duration.Seconds()
		r.Linef("  %s: %.1f decisions per script call, %.1f µs per call inside Redis (%.1f µs per decision), %.0f%% of a core; CPU: %s",
			run.what, decisions/float64(max(run.run.calls, 1)), run.run.evalUsec, run.run.evalUsec*float64(run.run.calls)/max(decisions, 1), 100*run.run.redisCPU, run.run.cpu)
	}
	r.Linef("CPU, open loop: %s\nCPU, control: %s", l.openCPU, l.ctrlCPU)
	exp0, exp1 := l.expBefore, l.expAfter
	r.Linef("redis-server during the open loop: %.0f keys expired, %.0f ms spent expiring keys; stalls >= 1 ms it recorded: %s",
		exp1["expired_keys"]-exp0["expired_keys"], exp1["expire_cycle_cpu_milliseconds"]-exp0["expire_cycle_cpu_milliseconds"], l.stalls)
	r.Linef("redis-server's own time per script call during the open loop (LATENCY HISTOGRAM evalsha, power-of-two buckets): p50 <= %s, p99 <= %s", l.scriptP50, l.scriptP99)
	closedRate := l.co.load.Rate()
	ratio := closedRate / l.set.rps
	r.Goal("throughput, Reserve (coalesced, as the API runs it) vs redis-benchmark SET", fmt.Sprintf("%s vs %s = %.2fx", stats.PerSecond(closedRate), stats.PerSecond(l.set.rps), ratio), ">= 0.50x", ratio >= 0.5)
	p99 := l.open.Lat.At(99)
	r.Goal(fmt.Sprintf("p99 at half that rate (%s)", stats.PerSecond(l.open.SentRate())), stats.MsFine(p99), "<= 1 ms", p99 <= time.Millisecond)
	return nil
}

// phaseTable adds a row per phase, redis-benchmark's SET first.
func (l *limiterScenario) phaseTable(r *report.Report) {
	r.Table("run", "decisions/s", "vs SET", "p50", "p99", "p99.9", "max")
	r.Row(fmt.Sprintf("redis-benchmark -t set -c %d", l.clients), stats.PerSecond(l.set.rps), "1.00x", l.set.p50, "—", "—", "—")
	row := func(what string, rate float64, lat stats.Latencies) {
		r.Row(what, stats.PerSecond(rate), fmt.Sprintf("%.2fx", rate/l.set.rps), stats.MsFine(lat.At(50)), stats.MsFine(lat.At(99)), stats.MsFine(lat.At(99.9)), stats.MsFine(lat.Max()))
	}
	row(fmt.Sprintf("Reserve, one call per decision, closed loop, %d clients", l.clients), l.one.load.Rate(), l.one.load.Lat)
	row(fmt.Sprintf("**Reserve, coalesced, closed loop, %d clients**", l.clients), l.co.load.Rate(), l.co.load.Lat)
	row(fmt.Sprintf("Reserve, coalesced, open loop at half (%s offered), %d clients", stats.PerSecond(l.co.load.Rate()/2), l.openers), l.open.SentRate(), l.open.Lat)
	row("control: go-redis SET, open loop at the same rate", l.control.SentRate(), l.control.Lat)
	for _, p := range l.sweeps {
		row("Reserve, coalesced, open loop at "+stats.PerSecond(p.rate), p.res.SentRate(), p.res.Lat)
	}
}

type setResult struct {
	rps     float64
	p50     string
	elapsed time.Duration
}

// redisCPU is the CPU time redis-server has used so far (user + system).
func redisCPU(ctx context.Context, c *redis.Client) time.Duration {
	f := infoFields(ctx, c, "cpu", "used_cpu_user", "used_cpu_sys")
	return time.Duration((f["used_cpu_user"] + f["used_cpu_sys"]) * float64(time.Second))
}

// infoFields reads numeric fields of one INFO section.
func infoFields(ctx context.Context, c *redis.Client, section string, names ...string) map[string]float64 {
	out := map[string]float64{}
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return out
	}
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for _, n := range names {
			if k == n {
				out[n], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return out
}

// latencyLatest lists the latency monitor's events: each cause of a
// stall, its latest and its longest duration.
func latencyLatest(ctx context.Context, c *redis.Client) string {
	raw, err := c.Do(ctx, "LATENCY", "LATEST").Slice()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	var parts []string
	for _, e := range raw {
		f, ok := e.([]any)
		if !ok || len(f) < 4 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%v (latest %v ms, max %v ms)", f[0], f[2], f[3]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// commandPercentile is an upper bound of the p-th percentile of the time
// Redis spent executing cmd since the last CONFIG RESETSTAT, from its
// latency histogram (cumulative counts in power-of-two µs buckets).
func commandPercentile(ctx context.Context, c *redis.Client, cmd string, p float64) string {
	raw, err := c.Do(ctx, "LATENCY", "HISTOGRAM", cmd).Result()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	// RESP3: {cmd: {calls: n, histogram_usec: {bound: cumulative count}}}.
	asMap := func(v any) map[string]any {
		out := map[string]any{}
		switch m := v.(type) {
		case map[any]any:
			for k, x := range m {
				out[fmt.Sprint(k)] = x
			}
		case []any: // RESP2: flat key, value pairs
			for i := 0; i+1 < len(m); i += 2 {
				out[fmt.Sprint(m[i])] = m[i+1]
			}
		}
		return out
	}
	cmdStats := asMap(asMap(raw)[cmd])
	calls, _ := strconv.ParseFloat(fmt.Sprint(cmdStats["calls"]), 64)
	if calls == 0 {
		return "unknown (no calls)"
	}
	type bucket struct{ bound, count float64 }
	var bs []bucket
	for k, v := range asMap(cmdStats["histogram_usec"]) {
		bound, err1 := strconv.ParseFloat(k, 64)
		count, err2 := strconv.ParseFloat(fmt.Sprint(v), 64)
		if err1 == nil && err2 == nil {
			bs = append(bs, bucket{bound, count})
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.bound, b.bound) })
	for _, b := range bs {
		if b.count >= calls*p/100 {
			return stats.MsFine(time.Duration(b.bound) * time.Microsecond)
		}
	}
	return "unknown"
}

// usecPerCall is the mean time Redis spent executing cmd since the last
// CONFIG RESETSTAT.
func usecPerCall(ctx context.Context, c *redis.Client, cmd string) float64 {
	return cmdStat(ctx, c, cmd, "usec_per_call")
}

// cmdStat is one field of INFO commandstats for cmd.
func cmdStat(ctx context.Context, c *redis.Client, cmd, field string) float64 {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
	}
	return 0
}

var setLine = regexp.MustCompile(`SET: ([0-9.]+) requests per second(?:, p50=([0-9.]+ msec))?`)

// redisBenchmarkSET runs redis-benchmark (installed with redis-server)
// against addr and parses its quiet-mode summary.
func redisBenchmarkSET(ctx context.Context, addr string, n, clients int) (setResult, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return setResult{}, fmt.Errorf("redis-benchmark not found on PATH (it comes with redis-server): %w", err)
	}
	host, port, _ := strings.Cut(addr, ":")
	start := time.Now()
	out, err := exec.CommandContext(ctx, bin, "-h", host, "-p", port, "-t", "set", "-n", strconv.Itoa(n), "-c", strconv.Itoa(clients), "-q").CombinedOutput()
	if err != nil {
		return setResult{}, fmt.Errorf("redis-benchmark: %w: %s", err, out)
	}
	// Progress lines end in \r; the summary is the last SET line.
	var last []string
	for _, line := range strings.FieldsFunc(string(out), func(r rune) bool { return r == '\r' || r == '\n' }) {
		if m := setLine.FindStringSubmatch(line); m != nil {
			last = m
		}
	}
	if last == nil {
		return setResult{}, fmt.Errorf("redis-benchmark: no SET summary in %q", out)
	}
	rps, _ := strconv.ParseFloat(last[1], 64)
	p50 := "—"
	if last[2] != "" {
		v, _ := strconv.ParseFloat(strings.TrimSuffix(last[2], " msec"), 64)
		p50 = stats.MsFine(time.Duration(v * float64(time.Millisecond)))
	}
	return setResult{rps: rps, p50: p50, elapsed: time.Since(start)}, nil
}
