package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/files"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/responses"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/pkg/usage"
	"github.com/sluice-dev/sluice/worker"
	"github.com/sluice-dev/sluice/workflows/signal"
)

// Core is what every Sluice process builds from its config, API or
// worker: the connections to Redis and Temporal, the stores in Redis, the
// live policy, and the activities a worker runs. Build makes it; the
// process files (api.go, worker.go) add their own components on top and
// start every loop. Build starts none: what runs from it belongs to a
// component's own calls (the limiter's batchers, the waker's reader) and
// ends with Close.
type Core struct {
	cfg      config.Config
	logger   *slog.Logger
	Redis    redis.UniversalClient
	Temporal client.Client
	// Notifier tells chat workflows by signal that they were granted a
	// permit or shed.
	Notifier signal.Notifier
	Events   *events.Log
	Gate     *admission.Gate
	// Policy is the live traffic policy the door and the healer share. The
	// API process polls it (Store.Run); the healer refreshes it before
	// each change.
	Policy *policy.Store
	// Waker is nil when admission.fast_wait is 0 and preemption is off:
	// a paused stream waits for its grant on it.
	Waker *admission.Waker
	// Asker keeps asking for streams to pause for the urgent requests
	// this process queued; nil when preemption is off.
	Asker   *admission.Asker
	Tokens  *tokens.Counter
	Prompts *prompt.Builder
	Limiter *limiter.Limiter
	// KBs holds the knowledge bases; Ingester writes documents into it.
	KBs *kbstore.Store
	// keeper seeds configured kbs again when Redis lost them (a worker's
	// loop).
	keeper   *kbKeeper
	Ingester *ingest.Ingester
	// Sessions keeps conversations (/v1/chat session_id).
	Sessions *session.Store
	// Metrics is the process's Prometheus registry; Latency the window of
	// stage latencies shared with every other instance through Redis.
	Metrics *metrics.Metrics
	Latency *latency.Window
	Chat    *activities.Chat
	// EmbedCache is the embedder behind its cache tier, which the API
	// serves embeddings through.
	EmbedCache *embed.Cache
	// Healing holds the healing workflow's activities.
	Healing *activities.Healing
	// Tracer traces requests through Redis, Temporal and the LLM
	// backends; nil when tracing is off (pkg/tracing).
	Tracer trace.TracerProvider
	// Codec seals workflow payloads (nil: codec.enabled is false); the
	// API serves it to operators at /codec.
	Codec *codec.Keyring
	// Usage is the usage ledger (nil: usage.store is off).
	Usage usage.Store
	// Responses keeps stored responses (nil: responses.store is off).
	Responses *responses.Store
	// Files keeps uploaded files (nil: files.store is off).
	Files *files.Store
	// Budgets counts the tiers' monthly budgets (limits.tiers.*.budget).
	Budgets *budget.Counter
}

// Build connects to Redis and Temporal and builds every component both
// processes hold, once. It fails fast, naming what it could not reach.
// RunAPI and RunWorker start from it; a test or a benchmark that needs a
// process's clients and stores without running one calls it too. Close
// the Core when done.
func Build(ctx context.Context, cfg config.Config, logger *slog.Logger) (_ *Core, err error) {
	c := &Core{cfg: cfg, logger: logger, Metrics: metrics.New(logger.With("component", "metrics")), Tracer: tracing.Provider()}
	// Before RegisterPools, whose collector reads the tenants' backlogs.
	c.Metrics.TrackTenants(cfg.Metrics.TenantSeries)
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.connectRedis(ctx); err != nil {
		return nil, err
	}
	if c.Tokens, err = tokens.For(cfg.Routing.Encoding); err != nil {
		return nil, err
	}
	c.Prompts = prompt.NewBuilder(cfg.LLM.SystemPrompt, c.Tokens)
	if err := c.buildRedisStores(ctx); err != nil {
		return nil, err
	}
	if err := c.connectTemporal(); err != nil {
		return nil, err
	}
	c.Notifier = signal.Notifier{Client: c.Temporal}
	c.registerDependencyMetrics()
	if c.Responses, err = openResponses(ctx, cfg.Responses); err != nil {
		return nil, err
	}
	if c.Files, err = openDatabase(ctx, "files", cfg.Files.Database, files.OpenSQLite, files.OpenPostgres); err != nil {
		return nil, err
	}
	if c.Usage, err = openUsage(ctx, cfg.Usage, logger.With("component", "usage")); err != nil {
		return nil, err
	}
	c.Budgets = NewBudgets(c.Redis, cfg, c.Usage)
	if c.Chat, err = c.buildChat(ctx); err != nil {
		return nil, err
	}
	if c.Healing, err = c.buildHealing(); err != nil {
		return nil, err
	}
	return c, nil
}

// buildRedisStores builds what lives in Redis: the rate limiter, the event
// log, the latency window, sessions, the admission gate (with its metrics)
// and, when admission.fast_wait is set, the grant waker.
func (c *Core) buildRedisStores(ctx context.Context) error {
	cfg := c.cfg
	// A reservation lives as long as the longest request: the longest
	// queue wait plus every LLM attempt, with room to spare.
	c.Limiter = limiter.New(c.Redis, limiter.Options{
		KeyPrefix:      cfg.Redis.KeyPrefix,
		ReservationTTL: longestWait(cfg) + cfg.LLM.Timeout*time.Duration(cfg.LLM.MaxAttempts) + 10*time.Minute,
		// Concurrent decisions at the door share script calls: under a
		// flood this multiplies what one Redis decides per second
		// (sluice-bench limiter); idle, a request goes alone at once.
		Batchers: 2,
		MaxBatch: 64,
		// Every caller is a request at the door, which promises a 503
		// within redis.request_timeout when Redis stalls; a caller waits
		// for its batch's call, so the call must be bounded by that too.
		BatchTimeout: cfg.Redis.RequestTimeout,
	})
	c.Events = events.NewLog(c.Redis, events.LogOptions{KeyPrefix: cfg.Redis.KeyPrefix, TTL: cfg.Events.TTL, MaxLen: cfg.Events.MaxLen})
	var err error
	c.Latency, err = latency.New(c.Redis, latency.Options{
		KeyPrefix: cfg.Redis.KeyPrefix, Slot: cfg.Metrics.LatencySlot, Retention: cfg.Metrics.LatencyRetention,
		Logger: c.logger.With("component", "latency"),
	})
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	c.Sessions, err = session.New(c.Redis, session.Options{KeyPrefix: cfg.Redis.KeyPrefix, TTL: cfg.Sessions.TTL, MaxTurns: cfg.Sessions.MaxTurns})
	if err != nil {
		return fmt.Errorf("sessions: %w", err)
	}
	gateOpts := GateOptions(cfg)
	// Every permit this process gives back is counted here, whichever
	// path gives it back.
	gateOpts.Holds = c.Metrics
	c.Gate, err = admission.New(c.Redis, gateOpts)
	if err != nil {
		return err
	}
	c.Policy = worker.NewPolicy(c.Redis, cfg, c.Gate, c.logger.With("component", "policy"))
	c.registerQueueMetrics()
	if cfg.Admission.FastWait > 0 || cfg.Admission.Preemption.Enabled {
		if c.Waker, err = admission.NewWaker(ctx, c.Redis, c.Gate); err != nil {
			return err
		}
	}
	if cfg.Admission.Preemption.Enabled {
		c.Asker = admission.NewAsker(c.Gate, c.Waker, PauseRules(cfg), c.logger.With("component", "asker"))
	}
	return nil
}

// PauseRules bound how often one stream may be paused
// (admission.preemption).
func PauseRules(cfg config.Config) admission.PauseRules {
	p := cfg.Admission.Preemption
	return admission.PauseRules{MinTokens: p.MinTokens, MaxPauses: p.MaxPauses}
}

// pausesFor is the set of pools whose waiters may have a stream paused
// for them (config.Pools.PausesFor).
func pausesFor(pools config.Pools) map[string]bool {
	out := map[string]bool{}
	for name := range pools.ByName() {
		out[name] = pools.PausesFor(name)
	}
	return out
}

// GateOptions is the admission gate cfg asks for: a permit count per
// pool and, when the pools share their servers, one budget for both.
func GateOptions(cfg config.Config) admission.Options {
	limits := map[string]int{}
	for name, p := range cfg.Pools.ByName() {
		limits[name] = p.MaxConcurrency
	}
	var groups []admission.Group
	if n := cfg.Pools.SharedLimit(); n > 0 {
		groups = []admission.Group{{Pools: request.Pools(), Limit: n}}
	}
	return admission.Options{
		KeyPrefix:     cfg.Redis.KeyPrefix,
		Lease:         cfg.Admission.Lease,
		WaiterTTL:     waiterTTL(cfg.Admission),
		MaxQueueDepth: cfg.Admission.MaxQueueDepth,
		Limits:        limits,
		Groups:        groups,
	}
}

// registerQueueMetrics exposes the pools' permits and queues, each
// tenant's backlog in them, and the tiers' weights, which the fairness
// rules divide each tenant's service by.
func (c *Core) registerQueueMetrics() {
	c.Metrics.RegisterPools(c.Gate.Pools(), func(ctx context.Context, pool string) (metrics.PoolStats, error) {
		st, err := c.Gate.QueueStats(ctx, pool)
		return metrics.PoolStats{InUse: st.InUse, Limit: st.Limit, Waiting: st.Waiting, OldestWait: st.OldestWait, Backlog: st.Backlog()}, err
	})
	c.Metrics.RegisterTierWeights(func() map[string]int {
		tiers := c.Policy.Current().Limits.Tiers
		weights := make(map[string]int, len(tiers))
		for name, t := range tiers {
			weights[name] = t.Weight
		}
		return weights
	})
}

// longestWait is the longest any tier may wait in the queue.
func longestWait(cfg config.Config) time.Duration {
	w := max(cfg.Admission.MaxWait, cfg.Pools.Short.MaxWait, cfg.Pools.Long.MaxWait)
	for _, t := range cfg.Limits.Tiers {
		w = max(w, t.MaxWait)
	}
	return w
}

// waiterTTL is how long a queue entry stays live between its waiter's
// re-checks: three missed re-checks mark it a zombie.
func waiterTTL(a config.Admission) time.Duration {
	return admission.AliveFor(a.RecheckInterval)
}

// registerDependencyMetrics exposes whether Redis and Temporal answer
// this process, checked as /readyz checks them.
func (c *Core) registerDependencyMetrics() {
	c.Metrics.RegisterDependency("redis", func(ctx context.Context) error { return c.Redis.Ping(ctx).Err() })
	c.Metrics.RegisterDependency("temporal", func(ctx context.Context) error {
		_, err := c.Temporal.CheckHealth(ctx, &client.CheckHealthRequest{})
		return err
	})
}

// Close releases connections; the process calls it once every loop that
// uses them has ended.
func (c *Core) Close() {
	if c.Limiter != nil {
		c.Limiter.Close()
	}
	if c.Asker != nil {
		c.Asker.Close()
	}
	if c.Waker != nil {
		_ = c.Waker.Close()
	}
	if c.Temporal != nil {
		c.Temporal.Close()
	}
	if c.Redis != nil {
		_ = c.Redis.Close()
	}
	if c.Responses != nil {
		_ = c.Responses.Close()
	}
	if c.Files != nil {
		_ = c.Files.Close()
	}
	if c.Usage != nil {
		_ = c.Usage.Close()
	}
}
