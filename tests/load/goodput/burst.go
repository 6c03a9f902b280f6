package goodput

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/progress"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
)

// The burst benchmark sends many concurrent SSE clients at once against a
// small number of permits and sorts every client's fate: an answer, a
// rejected or error event, a documented 503 or a 429 — or something that
// should never happen (another 5xx, a broken stream, a hang). Afterwards
// every permit and queue place must be back, and the simulator must never
// have seen more requests at once than there are permits.

type burstOptions struct {
	stack.MixFlags
	// The burst: how many clients over how many tenants and how many
	// source addresses, every how many a long one, how long an answer,
	// how fast they start.
	clients, tenants, addresses, longEvery, maxTokens int
	ramp                                              time.Duration
	// When a client is a hang, and how soon the pools must be idle after.
	deadline, drainWithin time.Duration
	// reference is how long the closed loop at one client per permit runs
	// before the burst, to measure the rate the burst's draining is
	// compared with (0: none).
	reference time.Duration
	// Sluice's settings at the door and in the queue.
	maxStarts, maxQueue int
	fastWait            time.Duration
}

func (b *burstScenario) Flags(fs *flag.FlagSet) {
	d := config.Default()
	b.MixFlags.Define(fs, d.Pools.Short.MaxConcurrency, d.Pools.Long.MaxConcurrency)
	fs.IntVar(&b.clients, "clients", 2000, "concurrent SSE clients, one request each")
	fs.IntVar(&b.longEvery, "long-every", 5, "every n-th client sends a query long enough for the long pool (0: none)")
	fs.IntVar(&b.tenants, "tenants", 20, "tenants (API keys) the clients are spread over")
	fs.IntVar(&b.addresses, "addresses", 0, "loopback source addresses the clients are spread over, as users come from theirs (0: one per client; 1: all from one, held to api.max_conns_per_ip)")
	fs.DurationVar(&b.ramp, "ramp", 0, "spread the clients' starts evenly over this long (0: all at once)")
	fs.IntVar(&b.maxTokens, "max-tokens", 16, "max_tokens of each request")
	fs.DurationVar(&b.deadline, "deadline", 0, "a client without a terminal event after this long is a hang (0: admission.max_wait + 60s)")
	fs.IntVar(&b.maxStarts, "max-starts", d.API.MaxStartsInFlight, "api.max_starts_in_flight")
	fs.IntVar(&b.maxQueue, "max-queue", d.Admission.MaxQueueDepth, "admission.max_queue_depth")
	fs.DurationVar(&b.fastWait, "fast-wait", d.Admission.FastWait, "admission.fast_wait (0: waiters learn of grants by signal only)")
	fs.DurationVar(&b.drainWithin, "drain-within", time.Minute, "how long after the last client the pools may take to be idle")
	fs.DurationVar(&b.reference, "reference", 15*time.Second, "before the burst, a closed loop of one client per permit this long measures the rate at 1x (0: skip)")
}

// burstScenario is the burst benchmark: its flags, every client's
// outcome, and what was left and seen during and after the burst.
type burstScenario struct {
	burstOptions
	keys []config.APIKey
	// tier is the burst tier as configured; maxWait its queue wait limit.
	tier        policy.Tier
	maxWait     time.Duration
	outcomes    []outcome
	clientsDone time.Duration
	final       []stack.PoolState
	// idleAfter is how long after the last client the pools were idle
	// (-1: not within -drain-within).
	idleAfter        time.Duration
	running, started int64
	seen             stack.WatchMax
	// rate1x is the done/s of the closed loop at one client per permit;
	// roomSize the door's waiting room.
	rate1x   float64
	roomSize int
	// startedRejected counts the workflows that were started only to be
	// rejected in the queue: Temporal spent on nobody's answer.
	startedRejected int64
	// For the progress line: the reference loop while it runs, then the
	// phase, its clients that ended and those answered.
	cur      atomic.Pointer[stepRun]
	prog     progress.Meter
	answered atomic.Int64
}

// outcome is one client's fate and how long it took.
type outcome struct {
	kind string
	// took runs from the POST to the outcome (an answer's answer time),
	// ttft to the first token (0: none came).
	took, ttft time.Duration
	tokens     int
	retryAfter int
}

const burstTier = "burst"

func (b *burstScenario) Stacks() ([]stack.Options, error) {
	b.keys = stack.TenantKeys(burstTier, b.tenants)
	return []stack.Options{{
		Simulator: func(sim *llmsim.Config) {
			b.MixFlags.Simulator(sim)
			sim.MaxNumSeqs = b.Permits()
		},
		Configure: func(cfg *config.Config) {
			b.MixFlags.Configure(cfg)
			cfg.API.MaxStartsInFlight = b.maxStarts
			cfg.Admission.MaxQueueDepth = b.maxQueue
			cfg.Admission.FastWait = b.fastWait
			stack.AddOpenTenants(cfg, burstTier, b.keys)
		},
	}}, nil
}

func (b *burstScenario) Drive(ctx context.Context, st *stack.Stack) error {
	b.tier, b.maxWait = st.Config.Limits.Tiers[burstTier], st.Config.Admission.MaxWait
	if b.tier.MaxWait > 0 {
		b.maxWait = b.tier.MaxWait
	}
	if b.deadline <= 0 {
		b.deadline = b.maxWait + 60*time.Second
	}
	b.roomSize = st.Config.API.WaitingRoom
	if err := b.measureReference(ctx, st); err != nil {
		return err
	}
	before, err := stack.CountChatWorkflows(ctx, st, "")
	if err != nil {
		return err
	}
	w := stack.StartWatch(ctx, st)
	defer w.Stop()
	b.prog.Enter("burst", int64(b.clients))
	b.send(ctx, st)
	// Every permit and queue place must come back.
	b.prog.Enter("wait-idle", -1)
	if b.final, b.idleAfter, err = stack.WaitIdle(ctx, st.Core.Gate, b.drainWithin); err != nil {
		return err
	}
	b.prog.Enter("count-workflows", -1)
	if b.running, err = stack.RunningChatWorkflows(ctx, st, 10*time.Second); err != nil {
		return err
	}
	if b.started, err = stack.CountChatWorkflows(ctx, st, ""); err != nil {
		return err
	}
	b.started -= before // the reference loop's
	// Visibility is eventually consistent: the count settles within a
	// second of the last close.
	time.Sleep(time.Second)
	if b.startedRejected, err = stack.CountChatWorkflows(ctx, st, fmt.Sprintf("SluiceOutcome = '%s'", request.OutcomeRejected)); err != nil {
		return err
	}
	w.Stop()
	b.seen = w.Max
	return nil
}

// measureReference runs one client per permit in a closed loop and keeps
// their done/s: the rate the burst's draining is compared with.
func (b *burstScenario) measureReference(ctx context.Context, st *stack.Stack) error {
	if b.reference <= 0 {
		return nil
	}
	hc := st.Client(b.Permits())
	run := newStepRun("reference", 3*time.Second, b.reference, b.deadline)
	b.cur.Store(run)
	run.closedLoop(ctx, b.Permits(), func(ctx context.Context, i int) chat.Result {
		q, key := "What does weighted fair queuing guarantee?", b.keys[i%len(b.keys)].Key
		if b.longEvery > 0 && i%b.longEvery == b.longEvery-1 {
			q = chat.LongQuery
		}
		body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, q, b.maxTokens)
		return chat.Read(ctx, hc, st.BaseURL, body, map[string]string{"Authorization": "Bearer " + key})
	})
	b.prog.Enter("reference-wait-idle", -1)
	b.cur.Store(nil)
	b.rate1x = float64(run.done.Load()) / b.reference.Seconds()
	_, _, err := stack.WaitIdle(ctx, st.Core.Gate, b.drainWithin)
	return err
}

func (b *burstScenario) Status(st *stack.Stack) string {
	if r := b.cur.Load(); r != nil {
		return r.status() + " " + st.PoolsNow()
	}
	return fmt.Sprintf("%s answered=%d %s", b.prog.String(), b.answered.Load(), st.PoolsNow())
}

// drainRate is the burst's served rate while it drained: answers per
// second between the first and the last.
func (b *burstScenario) drainRate() float64 {
	var first, last time.Duration
	n := 0
	for _, o := range b.outcomes {
		if o.kind != chat.KindDone {
			continue
		}
		if n == 0 || o.took < first {
			first = o.took
		}
		last = max(last, o.took)
		n++
	}
	if n < 2 || last <= first {
		return 0
	}
	return float64(n-1) / (last - first).Seconds()
}

// send runs every client to its outcome.
func (b *burstScenario) send(ctx context.Context, st *stack.Stack) {
	hcs := make([]*http.Client, b.sourceAddresses())
	for a := range hcs {
		hcs[a] = st.ClientFrom(burstAddr(a), b.clients/len(hcs)+1)
	}
	b.outcomes = make([]outcome, b.clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < b.clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if b.ramp > 0 {
				time.Sleep(time.Duration(int64(b.ramp) * int64(i) / int64(b.clients)))
			}
			q := "How does a token bucket refill?"
			if b.longEvery > 0 && i%b.longEvery == b.longEvery-1 {
				q = chat.LongQuery
			}
			body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, q, b.maxTokens)
			cctx, cancel := context.WithTimeout(ctx, b.deadline)
			defer cancel()
			t0 := time.Now()
			r := chat.Read(cctx, hcs[i%len(hcs)], st.BaseURL, body, map[string]string{"Authorization": "Bearer " + b.keys[i%len(b.keys)].Key})
			b.outcomes[i] = outcome{kind: r.Kind, took: time.Since(t0), ttft: r.TTFT, tokens: r.Tokens, retryAfter: r.RetryAfter}
			b.prog.Add(1)
			if r.Kind == chat.KindDone {
				b.answered.Add(1)
			}
		}(i)
	}
	wg.Wait()
	b.clientsDone = time.Since(start)
}

// sourceAddresses is how many addresses the clients come from.
func (b *burstScenario) sourceAddresses() int {
	if b.addresses <= 0 || b.addresses > b.clients {
		return b.clients
	}
	return b.addresses
}

// burstAddr is the a-th client address, in 127.2.0.0/16: Linux routes all
// of 127.0.0.0/8 to the loopback interface, so a client can bind any.
func burstAddr(a int) string { return fmt.Sprintf("127.2.%d.%d", a/250, a%250+1) }

func (b *burstScenario) Report(r *report.Report) error {
	ramp := "all at once"
	if b.ramp > 0 {
		ramp = fmt.Sprintf("starts spread over %v", b.ramp)
	}
	r.Header(fmt.Sprintf("%d concurrent SSE clients from %d loopback addresses (POST /v1/chat, max_tokens %d, every %d-th query long), %s, %d tenants on a tier with the standard tier's weight and queue caps (max %d waiting per tenant, max_wait %v) and no rate limits; %d permits shared by the pools (short may hold %d, long %d); api.max_starts_in_flight %d, admission.max_queue_depth %d; simulator time scale %g, %d sequences",
		b.clients, b.sourceAddresses(), b.maxTokens, b.longEvery, ramp, b.tenants, b.tier.MaxQueuePerTenant, b.maxWait, b.Permits(), b.ShortPerms, b.LongPerms,
		b.maxStarts, b.maxQueue, b.TimeScale, b.Permits()))
	bad, hangs, fivexx := b.outcomeTable(r)
	r.Linef("")
	r.Linef("all clients finished after %s; chat workflows started: %d (rejected in the queue after starting: %d), still running afterwards: %d", stats.Ms(b.clientsDone), b.started, b.startedRejected, b.running)
	r.Linef("max seen during the run: simulator running+waiting %d, permits in use %d (both pools), waiting %d", b.seen.Sim, b.seen.InUse, b.seen.Waiting)
	leaks := stack.LeftInPools(r.Linef, b.final)
	idle := "never"
	if b.idleAfter >= 0 {
		idle = stats.Ms(b.idleAfter) + " after the last client"
	}
	r.Goal("5xx other than the documented 503s (busy, queue_full, tenant_queue_full, unavailable, connections_full)", fmt.Sprint(fivexx), "0", fivexx == 0)
	r.Goal("clients without an answer, a rejected/error event, a documented 503 or a 429 (rate_limited, too_many_connections)", fmt.Sprint(bad), "0", bad == 0)
	r.Goal("hangs (no terminal event within "+b.deadline.String()+")", fmt.Sprint(hangs), "0", hangs == 0)
	r.Goal("permits in use + queue places left afterwards (both pools idle: "+idle+")", fmt.Sprint(leaks), "0", leaks == 0)
	r.Goal("most requests the simulator saw at once (running + waiting)", fmt.Sprint(b.seen.Sim), fmt.Sprintf("<= %d", b.Permits()), b.seen.Sim <= int64(b.Permits()))
	b.doorGoals(r)
	return nil
}

// doorGoals are the waiting room's promises: no 503 busy while it has
// room, a Retry-After on every rejection, and a crowd drained at the rate
// one client per permit is served.
func (b *burstScenario) doorGoals(r *report.Report) {
	busy, noRetry := 0, 0
	for _, o := range b.outcomes {
		if o.kind == "HTTP 503 "+request.ReasonBusy {
			busy++
		}
		refused := strings.HasPrefix(o.kind, "HTTP 429 ") || strings.HasPrefix(o.kind, "HTTP 503 ")
		if (refused || strings.HasPrefix(o.kind, "rejected ")) && o.retryAfter < 1 {
			noRetry++
		}
	}
	if b.clients <= b.roomSize {
		r.Goal(fmt.Sprintf("503 busy with %d clients and a waiting room of %d", b.clients, b.roomSize), fmt.Sprint(busy), "0", busy == 0)
	}
	r.Goal("rejections without retry_after_s, 429s and 503s without Retry-After", fmt.Sprint(noRetry), "0", noRetry == 0)
	if b.rate1x > 0 {
		drain := b.drainRate()
		r.Goal("served rate while draining / rate at one client per permit",
			fmt.Sprintf("%.1f/s / %.1f/s = %.2fx", drain, b.rate1x, drain/b.rate1x), ">= 0.8x", drain >= 0.8*b.rate1x)
	}
}

// outcomeTable adds a row per kind of outcome, most frequent first, and
// counts the clients with an outcome they may not get, the hangs, and the
// 5xx answers other than the documented 503s.
func (b *burstScenario) outcomeTable(r *report.Report) (bad, hangs, fivexx int) {
	byKind := map[string][]outcome{}
	for _, o := range b.outcomes {
		byKind[o.kind] = append(byKind[o.kind], o)
	}
	kinds := make([]string, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return len(byKind[kinds[i]]) > len(byKind[kinds[j]]) })
	r.Table("outcome", "clients", "share", "time to outcome p50", "p99", "max", "TTFT p50", "TTFT p99")
	for _, k := range kinds {
		got := byKind[k]
		ts := make([]time.Duration, len(got))
		var ttft []time.Duration
		for i, o := range got {
			ts[i] = o.took
			if o.tokens > 0 {
				ttft = append(ttft, o.ttft)
			}
		}
		l, f := stats.Sorted(ts), stats.Sorted(ttft)
		r.Row(k, fmt.Sprint(len(got)), fmt.Sprintf("%.1f%%", 100*float64(len(got))/float64(b.clients)), stats.Ms(l.At(50)), stats.Ms(l.At(99)), stats.Ms(l.Max()),
			stats.DurOrDash(f, 50), stats.DurOrDash(f, 99))
		if !acceptable(k) {
			bad += len(got)
		}
		if k == chat.KindHang {
			hangs += len(got)
		}
		if strings.HasPrefix(k, "HTTP 5") && !strings.HasPrefix(k, "HTTP 503 ") {
			fivexx += len(got)
		}
		if strings.HasPrefix(k, "HTTP 503 ") && !documented503[strings.TrimPrefix(k, "HTTP 503 ")] {
			fivexx += len(got)
		}
	}
	return bad, hangs, fivexx
}

var documented503 = map[string]bool{request.ReasonBusy: true, request.ReasonQueueFull: true, request.ReasonTenantQueueFull: true,
	request.ReasonUnavailable: true, request.ReasonConnectionsFull: true}

// acceptable says whether an outcome is one a client may get under a
// burst.
func acceptable(kind string) bool {
	switch {
	case kind == chat.KindDone:
		return true
	case strings.HasPrefix(kind, "rejected "), strings.HasPrefix(kind, "error "):
		return true
	case kind == "HTTP 429 "+request.ReasonRateLimited, kind == "HTTP 429 "+request.ReasonTooManyConnections:
		return true
	case strings.HasPrefix(kind, "HTTP 503 "):
		return documented503[strings.TrimPrefix(kind, "HTTP 503 ")]
	}
	return false
}
