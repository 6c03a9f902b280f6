// Package simcheck checks a capacity plan against Sluice's LLM simulator
// (pkg/llmsim): it builds the planned number of simulated replicas in
// process, each tuned to the plan's tokens/s per GPU, drives them with an
// open-loop Poisson load at the plan's peak QPS, and reports whether they
// keep up.
//
// It answers "does the arithmetic hold once requests queue, batch and
// finish at different times?", not "is the per-GPU rate right?": the rate
// is an input, and the simulator is tuned to it. Everything runs in one
// process with no sockets, in simulated time (Options.TimeScale), so a
// minute of peak takes a few seconds.
package simcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/capacity"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Options configures one run. Start from DefaultOptions.
type Options struct {
	// Workload is the peak load; its means are rounded to whole tokens.
	Workload capacity.Workload
	// TokensPerSecondPerGPU is the total (input + output) token rate one
	// replica sustains with a full batch of this workload. Each simulated
	// replica is tuned to it (see ReplicaConfig).
	TokensPerSecondPerGPU float64
	// GPUs is the fleet size being checked.
	GPUs int
	// MaxReplicas bounds the replicas actually simulated. A larger fleet
	// is checked through a slice of MaxReplicas replicas that receives the
	// same load per replica: GPUs/MaxReplicas of the fleet's QPS each.
	MaxReplicas int
	// MaxNumSeqs is each replica's batch limit.
	MaxNumSeqs int
	// Duration is the simulated length of the load.
	Duration time.Duration
	// TimeScale is wall time per simulated time: 0.1 runs ten times
	// faster than real time. Too small, and the scheduling noise of the
	// host shows up as simulated latency.
	TimeScale float64
	// Seed drives the Poisson arrivals and the simulator's answers.
	Seed uint64
	// Logger receives the simulator's logs; nil discards.
	Logger *slog.Logger
}

// DefaultOptions simulates one minute at ten times real speed, on at most
// 8 replicas of 16 sequences each. Faster time scales work on an idle
// machine; on a busy one the host falls behind simulated time (see
// Result.ArrivalLag).
func DefaultOptions() Options {
	return Options{
		MaxReplicas: 8,
		MaxNumSeqs:  llmsim.DefaultConfig().MaxNumSeqs,
		Duration:    time.Minute,
		TimeScale:   0.1,
		Seed:        1,
	}
}

func (o Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !(o.Workload.PeakQPS > 0) || math.IsInf(o.Workload.PeakQPS, 0) {
		bad("peak QPS must be > 0, got %v", o.Workload.PeakQPS)
	}
	if !(o.Workload.MeanInputTokens >= 0) || math.IsInf(o.Workload.MeanInputTokens, 0) {
		bad("mean input tokens must be >= 0, got %v", o.Workload.MeanInputTokens)
	}
	if math.Round(o.Workload.MeanOutputTokens) < 1 || math.IsInf(o.Workload.MeanOutputTokens, 0) {
		bad("mean output tokens must be >= 1, got %v", o.Workload.MeanOutputTokens)
	}
	if !(o.TokensPerSecondPerGPU > 0) || math.IsInf(o.TokensPerSecondPerGPU, 0) {
		bad("tokens/s per GPU must be > 0, got %v", o.TokensPerSecondPerGPU)
	}
	if o.GPUs < 1 {
		bad("GPUs must be >= 1, got %d", o.GPUs)
	}
	if o.MaxReplicas < 1 || o.MaxReplicas > llmsim.MaxReplicas {
		bad("MaxReplicas must be in 1..%d, got %d", llmsim.MaxReplicas, o.MaxReplicas)
	}
	if o.MaxNumSeqs < 1 || o.MaxNumSeqs > llmsim.MaxMaxNumSeqs {
		bad("MaxNumSeqs must be in 1..%d, got %d", llmsim.MaxMaxNumSeqs, o.MaxNumSeqs)
	}
	if o.Duration <= 0 {
		bad("Duration must be > 0, got %s", o.Duration)
	}
	if !(o.TimeScale > 0) || math.IsInf(o.TimeScale, 0) {
		bad("TimeScale must be > 0, got %v", o.TimeScale)
	}
	return errors.Join(errs...)
}

// ReplicaConfig tunes a simulator replica so that, with a full batch of
// requests of input+output tokens, it processes tokensPerSecond total
// tokens per second.
//
// In llmsim a request of I prompt and O output tokens holds a batch slot
// for O decode steps, and a step costs DecodeBase + B×DecodePerSeq plus
// PrefillPerToken for each token admitted in it. With the batch full (B =
// MaxNumSeqs) one request therefore costs the replica
//
//	O × (DecodeBase/B + DecodePerSeq) + I × PrefillPerToken
//
// of time, and its rate is (I+O) divided by that. ReplicaConfig keeps
// llmsim's default proportions between the three costs and scales them all
// by one factor to hit the rate. Below a full batch a replica is less
// efficient (DecodeBase is shared by fewer sequences), as a real GPU is.
// The KV cache is sized to hold a full batch, because the formula being
// checked has no memory term.
func ReplicaConfig(inputTokens, outputTokens, maxNumSeqs int, tokensPerSecond float64) llmsim.Config {
	cfg := llmsim.DefaultConfig()
	cfg.MaxNumSeqs = maxNumSeqs
	b := float64(maxNumSeqs)
	perRequest := float64(outputTokens)*(cfg.DecodeBase.Seconds()/b+cfg.DecodePerSeq.Seconds()) +
		float64(inputTokens)*cfg.PrefillPerToken.Seconds()
	want := float64(inputTokens+outputTokens) / tokensPerSecond
	k := want / perRequest
	scale := func(d time.Duration) time.Duration { return time.Duration(math.Round(float64(d) * k)) }
	cfg.DecodeBase = max(scale(cfg.DecodeBase), 1)
	cfg.DecodePerSeq = scale(cfg.DecodePerSeq)
	cfg.PrefillPerToken = scale(cfg.PrefillPerToken)
	perSeq := (inputTokens + outputTokens + 1 + cfg.BlockSize - 1) / cfg.BlockSize
	cfg.KVCacheBlocks = max(cfg.KVCacheBlocks, maxNumSeqs*(perSeq+1))
	// Every answer runs to exactly outputTokens: the formula uses means,
	// and a fixed length keeps the check about the mean.
	cfg.AnswerMinTokens, cfg.AnswerMaxTokens = outputTokens, outputTokens
	cfg.DefaultMaxTokens = outputTokens
	return cfg
}

// Result is what one run measured. Times are simulated.
type Result struct {
	// GPUs is the fleet size checked; Replicas how many were simulated
	// (fewer when the run is a slice of a large fleet).
	GPUs     int
	Replicas int
	// OfferedQPS is the arrival rate the simulated replicas received, and
	// OfferedTokensPerSecond the token load it carries.
	OfferedQPS             float64
	OfferedTokensPerSecond float64
	// InputTokens and OutputTokens are each request's actual sizes.
	InputTokens, OutputTokens int
	// Sent, Completed and Unfinished count requests: Unfinished ones were
	// still queued or running when the run was cut off.
	Sent, Completed, Unfinished int
	// ThroughputTokensPerSecond is tokens of requests that completed in
	// the steady part of the load (after the first quarter), per second.
	ThroughputTokensPerSecond float64
	// Utilization is that throughput over the replicas' rated throughput.
	Utilization float64
	// P50 and P99 are arrival-to-finish latencies of the requests that
	// arrived in the steady part. An unfinished request counts with its
	// age when the run was cut off, so with Unfinished > 0 they are lower
	// bounds.
	P50, P99 time.Duration
	// QueueAtEnd is the simulator's waiting queue when the load stopped,
	// MaxQueue the largest seen.
	QueueAtEnd, MaxQueue int
	// ArrivalLag is the latest an arrival was sent after its planned
	// time. More than a fraction of a second means the host could not keep
	// up with simulated time, and the run measured the host, not the plan:
	// use a larger TimeScale.
	ArrivalLag time.Duration
	// Holds reports that the replicas kept up: the queue at the end of the
	// load was at most one full batch per replica. A queue that grows
	// without bound fails this by the end of any run long enough to show
	// it.
	Holds bool
}

// Run simulates o.GPUs replicas (or a slice of them) under the peak load.
func Run(ctx context.Context, o Options) (Result, error) {
	if err := o.validate(); err != nil {
		return Result{}, fmt.Errorf("simulate plan: %w", err)
	}
	replicas := min(o.GPUs, o.MaxReplicas)
	in, out := int(math.Round(o.Workload.MeanInputTokens)), int(math.Round(o.Workload.MeanOutputTokens))
	cfg := ReplicaConfig(in, out, o.MaxNumSeqs, o.TokensPerSecondPerGPU)
	cfg.Replicas = replicas
	cfg.TimeScale = o.TimeScale
	cfg.Seed = int64(o.Seed)
	body, actualIn, err := requestBody(cfg.Encoding, in, out)
	if err != nil {
		return Result{}, fmt.Errorf("simulate plan: %w", err)
	}
	sim, err := llmsim.New(cfg, o.Logger)
	if err != nil {
		return Result{}, fmt.Errorf("simulate plan: %w", err)
	}
	defer sim.Close()

	r := &run{
		o: o, sim: sim, handler: sim.Handler(), body: body,
		qps: o.Workload.PeakQPS * float64(replicas) / float64(o.GPUs),
	}
	res := r.drive(ctx)
	res.GPUs, res.Replicas = o.GPUs, replicas
	res.OfferedQPS = r.qps
	res.InputTokens, res.OutputTokens = actualIn, out
	res.OfferedTokensPerSecond = r.qps * float64(actualIn+out)
	res.Utilization = res.ThroughputTokensPerSecond / (float64(replicas) * o.TokensPerSecondPerGPU)
	res.Holds = res.QueueAtEnd <= replicas*o.MaxNumSeqs
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("simulate plan: %w", err)
	}
	return res, nil
}

// requestBody builds a chat request whose prompt is inputTokens tokens as
// the simulator counts them (content plus chat framing), or as close as the
// framing allows.
func requestBody(encoding string, inputTokens, outputTokens int) ([]byte, int, error) {
	counter, err := tokens.For(encoding)
	if err != nil {
		return nil, 0, err
	}
	count := func(n int) int {
		return counter.CountChat([]tokens.Message{{Role: "user", Content: strings.Repeat(" hello", n)}})
	}
	framing := count(0)
	n := max(inputTokens-framing, 0)
	// " hello" is one token in both encodings, so this settles at once;
	// the loop only guards against a tokenizer that merges repeats.
	for range 4 {
		if d := inputTokens - count(n); d != 0 && n+d >= 0 {
			n += d
		}
	}
	body, err := json.Marshal(map[string]any{
		"model":      "sluice-sim",
		"max_tokens": outputTokens,
		"messages":   []map[string]string{{"role": "user", "content": strings.Repeat(" hello", n)}},
	})
	if err != nil {
		return nil, 0, fmt.Errorf("encode request: %w", err)
	}
	return body, count(n), nil
}

type run struct {
	o       Options
	sim     *llmsim.Server
	handler http.Handler
	body    []byte
	qps     float64

	mu   sync.Mutex
	reqs []*request
}

type request struct {
	arrival  time.Duration // simulated, since the start
	finish   time.Duration // simulated; 0 while unfinished
	tokens   int
	finished bool
}

// drive sends the open-loop load, samples the queue, waits a bounded time
// for stragglers and measures.
func (r *run) drive(ctx context.Context) Result {
	clock := simClock{start: time.Now(), scale: r.o.TimeScale}
	reqCtx, abort := context.WithCancel(ctx)
	defer abort()
	var wg sync.WaitGroup
	var res Result

	stopSampling := r.sampleQueue(clock)
	res.ArrivalLag = r.sendArrivals(ctx, reqCtx, clock, &wg)
	clock.sleepUntil(ctx, r.o.Duration)
	res.QueueAtEnd = r.sim.Stats().Waiting
	res.MaxQueue = max(stopSampling(), res.QueueAtEnd)

	cutoff := r.awaitStragglers(ctx, clock, &wg, abort)
	r.measure(&res, cutoff)
	return res
}

// simClock converts between wall time and simulated time since start.
type simClock struct {
	start time.Time
	scale float64 // wall time per simulated time
}

// now is the simulated time since start.
func (c simClock) now() time.Duration {
	return time.Duration(float64(time.Since(c.start)) / c.scale)
}

// wall is the wall time that a simulated duration takes.
func (c simClock) wall(sim time.Duration) time.Duration {
	return time.Duration(float64(sim) * c.scale)
}

// sleepUntil returns at simulated time at, or earlier if ctx is done.
func (c simClock) sleepUntil(ctx context.Context, at time.Duration) {
	d := c.wall(at) - time.Since(c.start)
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// sampleQueue samples the simulator's waiting queue once a simulated
// second until stop is called; stop returns the largest queue seen.
func (r *run) sampleQueue(clock simClock) (stop func() int) {
	done := make(chan struct{})
	quit := make(chan struct{})
	maxQueue := 0
	go func() {
		defer close(done)
		t := time.NewTicker(max(clock.wall(time.Second), time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				maxQueue = max(maxQueue, r.sim.Stats().Waiting)
			}
		}
	}()
	return func() int {
		close(quit)
		<-done
		return maxQueue
	}
}

// sendArrivals sends a request, in a goroutine of wg under reqCtx, at each
// arrival of a Poisson process of rate r.qps until the load's duration is
// up or ctx is done. It returns the latest an arrival was sent after its
// planned time.
func (r *run) sendArrivals(ctx, reqCtx context.Context, clock simClock, wg *sync.WaitGroup) (lag time.Duration) {
	rng := rand.New(rand.NewPCG(r.o.Seed, 0x5eed))
	var at time.Duration
	for {
		at += time.Duration(rng.ExpFloat64() / r.qps * float64(time.Second))
		if at >= r.o.Duration {
			return lag
		}
		clock.sleepUntil(ctx, at)
		if ctx.Err() != nil {
			return lag
		}
		req := &request{arrival: clock.now()}
		lag = max(lag, req.arrival-at)
		r.mu.Lock()
		r.reqs = append(r.reqs, req)
		r.mu.Unlock()
		wg.Go(func() {
			n, ok := r.send(reqCtx)
			r.mu.Lock()
			defer r.mu.Unlock()
			if ok {
				req.finished, req.finish, req.tokens = true, clock.now(), n
			}
		})
	}
}

// awaitStragglers gives the requests of wg a quarter of the run to finish,
// then cancels the rest with abort, waits for them and returns the
// simulated time of the cut-off. A backlog that needs longer is what the
// run set out to detect, not something to wait for.
func (r *run) awaitStragglers(ctx context.Context, clock simClock, wg *sync.WaitGroup, abort context.CancelFunc) (cutoff time.Duration) {
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	grace := time.NewTimer(clock.wall(r.o.Duration / 4))
	defer grace.Stop()
	select {
	case <-finished:
	case <-grace.C:
	case <-ctx.Done():
	}
	cutoff = clock.now()
	abort()
	<-finished
	return cutoff
}

// measure counts the requests into res and sets the throughput and
// latencies of the steady part of the load, the part after its first
// quarter. A request unfinished at cutoff counts with its age then.
func (r *run) measure(res *Result, cutoff time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	steady := r.o.Duration / 4
	var lat []time.Duration
	var steadyTokens int
	for _, q := range r.reqs {
		res.Sent++
		if q.finished {
			res.Completed++
			if q.finish >= steady && q.finish < r.o.Duration {
				steadyTokens += q.tokens
			}
		} else {
			res.Unfinished++
		}
		if q.arrival >= steady {
			end := cutoff
			if q.finished {
				end = q.finish
			}
			lat = append(lat, end-q.arrival)
		}
	}
	res.ThroughputTokensPerSecond = float64(steadyTokens) / (r.o.Duration - steady).Seconds()
	slices.Sort(lat)
	res.P50, res.P99 = percentile(lat, 0.50), percentile(lat, 0.99)
}

// send runs one chat completion through the simulator's handler, in
// process, and returns its total tokens.
func (r *run) send(ctx context.Context) (int, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", bytes.NewReader(r.body))
	if err != nil {
		return 0, false
	}
	req.Header.Set("Content-Type", "application/json")
	w := &responseBuffer{header: http.Header{}, status: http.StatusOK}
	r.handler.ServeHTTP(w, req)
	if w.status != http.StatusOK || ctx.Err() != nil {
		return 0, false
	}
	var out struct {
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(w.body.Bytes(), &out) != nil {
		return 0, false
	}
	return out.Usage.TotalTokens, true
}

// responseBuffer is the least http.ResponseWriter that a non-streaming
// simulator request needs.
type responseBuffer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *responseBuffer) Header() http.Header         { return b.header }
func (b *responseBuffer) Write(p []byte) (int, error) { return b.body.Write(p) }
func (b *responseBuffer) WriteHeader(status int)      { b.status = status }

// percentile is nearest-rank on sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
