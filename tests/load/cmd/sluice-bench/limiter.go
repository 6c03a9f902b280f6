package main

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
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/limiter"
)

// The limiter benchmark measures the token-bucket decision at the door:
// limiter.Reserve (one EVALSHA charging three buckets) from C clients, each
// on its own connection, against redis-benchmark's SET from as many
// clients on the same redis-server in the same run; then the latency of
// Reserve at half the throughput it reached, open loop.

type limiterOptions struct {
	clients   int
	instances int
	batchers  int
	openers   int
	duration  time.Duration
	setN      int
	callers   int
	sweep     string
	cost      float64
}

func defineLimiter(fs *flag.FlagSet) func(context.Context) error {
	var o limiterOptions
	fs.IntVar(&o.clients, "c", 50, "concurrent clients, each on its own connection (also redis-benchmark -c)")
	fs.IntVar(&o.instances, "instances", 2, "limiter instances of the coalesced runs (API processes), the -c clients spread over them")
	fs.IntVar(&o.batchers, "batchers", 2, "batchers per coalescing limiter (limiter.Options.Batchers, as worker.NewRuntime sets it)")
	fs.IntVar(&o.openers, "open-clients", 50, "clients (connections) of the open-loop phase, at most -c; requests are dealt to them in turn")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each limiter phase (closed loop, then open loop)")
	fs.IntVar(&o.setN, "set-n", 1000000, "requests of the redis-benchmark SET run (-n)")
	fs.IntVar(&o.callers, "callers", 20000, "distinct callers (tenant = caller/10, user, IP) the decisions are spread over")
	fs.StringVar(&o.sweep, "sweep", "1000,2000,4000", "decisions/s of extra open-loop phases (coalesced), to show where the tail stays short; empty for none")
	fs.Float64Var(&o.cost, "cost", 600, "tokens each request is charged (prompt + max output)")
	return func(ctx context.Context) error { return runLimiter(ctx, o) }
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

func runLimiter(ctx context.Context, o limiterOptions) error {
	st, err := launchStack(ctx, stackOptions{RedisOnly: true})
	if err != nil {
		return err
	}
	defer st.Close()
	if n := len(benchPolicy.Buckets(callerOf(0), o.cost)); n != 3 {
		return fmt.Errorf("bench policy has %d buckets, want 3", n)
	}

	admin := redis.NewClient(&redis.Options{Addr: st.redis.Addr})
	defer admin.Close()
	_ = admin.ConfigResetStat(ctx).Err()
	setCPU := redisCPU(ctx, admin)
	set, err := redisBenchmarkSET(ctx, st.redis.Addr, o.setN, o.clients)
	if err != nil {
		return err
	}
	setCPU = redisCPU(ctx, admin) - setCPU
	setUsec := usecPerCall(ctx, admin, "set")
	_ = admin.ConfigResetStat(ctx).Err()

	// One limiter per client, each over a client with a single connection:
	// C clients are C connections, as C API instances would be.
	lims := make([]*limiter.Limiter, o.clients)
	conns := make([]*redis.Client, o.clients)
	for i := range lims {
		c := redis.NewClient(&redis.Options{Addr: st.redis.Addr, PoolSize: 1, MinIdleConns: 1})
		defer c.Close()
		if err := c.Ping(ctx).Err(); err != nil {
			return err
		}
		conns[i] = c
		lims[i] = limiter.New(c, limiter.Options{KeyPrefix: "bench:", ReservationTTL: 5 * time.Minute})
	}
	// The coalescing limiters, as the API runs them: a few instances, each
	// with its batchers over a connection pool, shared by all callers.
	coalesced := make([]*limiter.Limiter, max(o.instances, 1))
	for i := range coalesced {
		c := redis.NewClient(&redis.Options{Addr: st.redis.Addr, PoolSize: o.batchers + 2})
		defer c.Close()
		coalesced[i] = limiter.New(c, limiter.Options{KeyPrefix: "bench:", ReservationTTL: 5 * time.Minute, Batchers: o.batchers, MaxBatch: 64})
		defer coalesced[i].Close()
	}
	var seq atomic.Int64
	var allowed, limited atomic.Int64
	single := func(client int) *limiter.Limiter { return lims[client] }
	shared := func(client int) *limiter.Limiter { return coalesced[client%len(coalesced)] }
	pick := single
	reserve := func(ctx context.Context, client int) error {
		n := seq.Add(1)
		caller := callerOf(int(n % int64(o.callers)))
		d, err := pick(client).Reserve(ctx, "r"+strconv.FormatInt(n, 36), benchPolicy.Buckets(caller, o.cost))
		if err != nil {
			return err
		}
		if d.Status == limiter.Allowed {
			allowed.Add(1)
		} else {
			limited.Add(1)
		}
		return nil
	}
	// Load the script on every connection's server side once (EVALSHA
	// falls back to EVAL on the first call only).
	if err := reserve(ctx, 0); err != nil {
		return err
	}

	// Closed loop: every client issues its next decision as soon as the
	// previous one returns.
	var errs atomic.Int64
	type closedRun struct {
		rate     float64
		lat      latencies
		calls    int64 // script calls Redis ran
		evalUsec float64
		redisCPU float64 // share of a core
		cpu      string
	}
	closedLoop := func() closedRun {
		var mu sync.Mutex
		var all []time.Duration
		var wg sync.WaitGroup
		_ = admin.ConfigResetStat(ctx).Err()
		cpu0 := redisCPU(ctx, admin)
		snap0 := takeCPU()
		start := time.Now()
		deadline := start.Add(o.duration)
		for c := 0; c < o.clients; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				lat := make([]time.Duration, 0, 1<<14)
				for time.Now().Before(deadline) && ctx.Err() == nil {
					t0 := time.Now()
					if err := reserve(ctx, c); err != nil {
						errs.Add(1)
						continue
					}
					lat = append(lat, time.Since(t0))
				}
				mu.Lock()
				all = append(all, lat...)
				mu.Unlock()
			}(c)
		}
		wg.Wait()
		elapsed := time.Since(start)
		return closedRun{
			rate: float64(len(all)) / elapsed.Seconds(), lat: sorted(all),
			calls: int64(cmdStat(ctx, admin, "evalsha", "calls")), evalUsec: usecPerCall(ctx, admin, "evalsha"),
			redisCPU: (redisCPU(ctx, admin) - cpu0).Seconds() / elapsed.Seconds(), cpu: cpuBetween(snap0, takeCPU()),
		}
	}
	one := closedLoop()
	pick = shared
	co := closedLoop()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	closedRate := co.rate

	if o.openers <= 0 || o.openers > o.clients {
		o.openers = o.clients
	}
	half := closedRate / 2
	// Redis's own record of stalls of 1 ms or more, by cause, and of the
	// time it spends expiring keys, for the latency phase.
	_ = admin.ConfigSet(ctx, "latency-monitor-threshold", "1").Err()
	_ = admin.Do(ctx, "LATENCY", "RESET").Err()
	_ = admin.ConfigResetStat(ctx).Err() // and with it the command latency histograms
	exp0 := infoFields(ctx, admin, "stats", "expired_keys", "expire_cycle_cpu_milliseconds")
	snap2 := takeCPU()
	open := paced(ctx, half, o.duration, o.openers, func(ctx context.Context, w, _ int) error { return reserve(ctx, w) })
	if ctx.Err() != nil {
		return ctx.Err()
	}
	openRate := float64(open.sent) / open.elapsed.Seconds()
	snap3 := takeCPU()
	exp1 := infoFields(ctx, admin, "stats", "expired_keys", "expire_cycle_cpu_milliseconds")
	stalls := latencyLatest(ctx, admin)
	scriptP99, scriptP50 := commandPercentile(ctx, admin, "evalsha", 99), commandPercentile(ctx, admin, "evalsha", 50)
	// The same open-loop harness issuing plain SETs at the same rate: what
	// the client, the Go runtime and the shared cores add by themselves.
	snap4 := takeCPU()
	control := paced(ctx, half, o.duration, o.openers, func(ctx context.Context, w, i int) error {
		return conns[w].Set(ctx, "bench:set:"+strconv.Itoa(i%100000), "x", 0).Err()
	})
	snap5 := takeCPU()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	type sweepPhase struct {
		rate float64
		res  pacedResult
	}
	var sweep []sweepPhase
	for _, f := range strings.Split(o.sweep, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		rate, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || rate <= 0 {
			return fmt.Errorf("-sweep: bad rate %q", f)
		}
		res := paced(ctx, rate, o.duration, o.openers, func(ctx context.Context, w, _ int) error { return reserve(ctx, w) })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sweep = append(sweep, sweepPhase{rate, res})
	}

	header("limiter", fmt.Sprintf("limiter.Reserve (EVALSHA of reserve.lua, 3 buckets: tenant tokens, user tokens, IP requests; %d callers) from %d clients, %v per phase: one script call per decision (%d limiters, a connection each), then coalesced as the API runs it (%d limiters, %d batchers each); redis-benchmark SET -n %d -c %d on the same redis-server, same run",
		o.callers, o.clients, o.duration, o.clients, len(coalesced), o.batchers, o.setN, o.clients))
	fmt.Println("| run | decisions/s | vs SET | p50 | p99 | p99.9 | max |")
	fmt.Println("|---|---|---|---|---|---|---|")
	fmt.Printf("| redis-benchmark -t set -c %d | %s | 1.00x | %s | — | — | — |\n", o.clients, perSecond(set.rps), set.p50)
	row := func(what string, rate float64, l latencies) {
		fmt.Printf("| %s | %s | %.2fx | %s | %s | %s | %s |\n", what, perSecond(rate), rate/set.rps,
			msFine(l.at(50)), msFine(l.at(99)), msFine(l.at(99.9)), msFine(l.max()))
	}
	row(fmt.Sprintf("Reserve, one call per decision, closed loop, %d clients", o.clients), one.rate, one.lat)
	row(fmt.Sprintf("**Reserve, coalesced, closed loop, %d clients**", o.clients), co.rate, co.lat)
	row(fmt.Sprintf("Reserve, coalesced, open loop at half (%s offered), %d clients", perSecond(half), o.openers), openRate, open.lat)
	row("control: go-redis SET, open loop at the same rate", float64(control.sent)/control.elapsed.Seconds(), control.lat)
	for _, p := range sweep {
		row(fmt.Sprintf("Reserve, coalesced, open loop at %s", perSecond(p.rate)), float64(p.res.sent)/p.res.elapsed.Seconds(), p.res.lat)
	}
	fmt.Println()
	total := allowed.Load() + limited.Load()
	fmt.Printf("decisions: %d (%.1f%% allowed, the rest refused by a bucket), errors %d; open loop: %d of %d sent over 1 ms late because their client was still busy\n",
		total, 100*float64(allowed.Load())/float64(max(total, 1)), errs.Load()+int64(open.errs), open.late, open.sent)
	fmt.Printf("redis-server: SET %.1f µs per call inside Redis, %.0f%% of a core during redis-benchmark\n", setUsec, 100*setCPU.Seconds()/set.elapsed.Seconds())
	for _, r := range []struct {
		what string
		run  closedRun
	}{{"one call per decision", one}, {"coalesced", co}} {
		decisions := r.run.rate * o.duration.Seconds()
		fmt.Printf("  %s: %.1f decisions per script call, %.1f µs per call inside Redis (%.1f µs per decision), %.0f%% of a core; CPU: %s\n",
			r.what, decisions/float64(max(r.run.calls, 1)), r.run.evalUsec, r.run.evalUsec*float64(r.run.calls)/max(decisions, 1), 100*r.run.redisCPU, r.run.cpu)
	}
	fmt.Printf("CPU, open loop: %s\nCPU, control: %s\n", cpuBetween(snap2, snap3), cpuBetween(snap4, snap5))
	fmt.Printf("redis-server during the open loop: %.0f keys expired, %.0f ms spent expiring keys; stalls >= 1 ms it recorded: %s\n",
		exp1["expired_keys"]-exp0["expired_keys"], exp1["expire_cycle_cpu_milliseconds"]-exp0["expire_cycle_cpu_milliseconds"], stalls)
	fmt.Printf("redis-server's own time per script call during the open loop (LATENCY HISTOGRAM evalsha, power-of-two buckets): p50 <= %s, p99 <= %s\n", scriptP50, scriptP99)
	ratio := closedRate / set.rps
	goal("throughput, Reserve (coalesced, as the API runs it) vs redis-benchmark SET", fmt.Sprintf("%s vs %s = %.2fx", perSecond(closedRate), perSecond(set.rps), ratio), ">= 0.50x", ratio >= 0.5)
	p99 := open.lat.at(99)
	goal(fmt.Sprintf("p99 at half that rate (%s)", perSecond(openRate)), msFine(p99), "<= 1 ms", p99 <= time.Millisecond)
	return nil
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
	stats := asMap(asMap(raw)[cmd])
	calls, _ := strconv.ParseFloat(fmt.Sprint(stats["calls"]), 64)
	if calls == 0 {
		return "unknown (no calls)"
	}
	type bucket struct{ bound, count float64 }
	var bs []bucket
	for k, v := range asMap(stats["histogram_usec"]) {
		bound, err1 := strconv.ParseFloat(k, 64)
		count, err2 := strconv.ParseFloat(fmt.Sprint(v), 64)
		if err1 == nil && err2 == nil {
			bs = append(bs, bucket{bound, count})
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.bound, b.bound) })
	for _, b := range bs {
		if b.count >= calls*p/100 {
			return msFine(time.Duration(b.bound) * time.Microsecond)
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
		p50 = msFine(time.Duration(v * float64(time.Millisecond)))
	}
	return setResult{rps: rps, p50: p50, elapsed: time.Since(start)}, nil
}
