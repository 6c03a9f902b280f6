package app

import (
	"context"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluice-dev/sluice/api"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/follow/liveness"
	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/semaphore"
	"github.com/sluice-dev/sluice/pkg/waitroom"
	"github.com/sluice-dev/sluice/worker"
)

// RunAPI runs a whole API process until ctx ends: the HTTP server, the
// event hub and, if api.embedded_worker is set, a Temporal worker in the
// same process so that eager workflow start can hand it the first workflow
// task. ready, if not nil, gets the bound HTTP address.
func RunAPI(ctx context.Context, cfg config.Config, logger *slog.Logger, ready func(addr string)) error {
	core, err := Build(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer core.Close()
	p, err := newAPIProcess(core)
	if err != nil {
		return err
	}
	return p.run(ctx, ready)
}

// apiProcess is an API process: its Core and what only it builds on top.
type apiProcess struct {
	core *Core
	hub  *events.Hub
	// keys verifies managed API keys; its loop follows their revocations.
	keys *keys.Cache
	// doorway is the door (package door): admission at the edge. The
	// admission gate it queues requests at is core.Gate. Its waiting room
	// runs here.
	doorway *door.Door
	room    *waitroom.Room
	// follower follows started requests for their clients; sweeper ends
	// the streams of those whose workflow is gone.
	follower *follow.Follower
	sweeper  *liveness.Sweeper
	server   *api.Server
	// serveMetrics serves metrics.addr (nil: they are on api.addr).
	serveMetrics func(context.Context) error
	// worker is the embedded worker (nil: api.embedded_worker is off).
	worker *worker.Worker
}

// newAPIProcess builds what the API process adds to its core: the event
// hub, the key cache, the client-address hasher, the bans, the door (with
// its waiting room, idempotency keys and give-back), the follower (with
// its liveness sweep), the ingestion slots, the HTTP server, the metrics
// listener and the embedded worker.
func newAPIProcess(c *Core) (*apiProcess, error) {
	cfg, logger := c.cfg, c.logger
	p := &apiProcess{core: c}
	p.hub = events.NewHub(c.Redis, c.Events, events.HubOptions{Logger: logger.With("component", "event-hub")})
	p.keys = keys.NewCache(keys.NewStore(c.Redis, cfg.Redis.KeyPrefix),
		keys.CacheOptions{TTL: cfg.Auth.KeyCacheTTL, Logger: logger.With("component", "keys")})
	addresses := iphash.New([]byte(cfg.Privacy.IPHashKey))
	if addresses.UsesDevKey() {
		logger.Warn("privacy.ip_hash_key is not set: client addresses in Redis keys, bans and logs are hashed with a public key, " +
			"which anyone can reverse by hashing every IPv4 address; set it (the same on every instance) in production")
	}
	bans, err := newBans(c, addresses)
	if err != nil {
		return nil, err
	}
	if err := p.buildDoor(bans, addresses); err != nil {
		return nil, err
	}
	ingestSlots, err := semaphore.New(c.Redis, semaphore.Options{
		Key: cfg.Redis.KeyPrefix + "ingest:permits", Limit: cfg.Ingest.MaxConcurrent,
		GroupLimit: cfg.Ingest.TenantPermits(), Lease: cfg.Ingest.Lease})
	if err != nil {
		return nil, err
	}
	p.server, err = api.New(api.Options{
		Config: cfg, Temporal: c.Temporal, Redis: c.Redis, Events: c.Events, Gate: c.Gate, Prompts: c.Prompts,
		Policy: c.Policy, Door: p.doorway, Follow: p.follower, Addresses: addresses, KBs: c.KBs, Ingester: c.Ingester, IngestSlots: ingestSlots, Embeddings: c.EmbedCache,
		Sessions: c.Sessions, Usage: c.Usage, Responses: c.Responses, Files: c.Files, Budgets: c.Budgets, Metrics: c.Metrics, Codec: c.Codec, Keys: p.keys, Bans: bans, Tracer: c.Tracer,
		Logger: logger.With("component", "api"),
	})
	if err != nil {
		return nil, err
	}
	if cfg.Metrics.Addr != "" {
		if p.serveMetrics, err = metricsServer(cfg.Metrics.Addr, "metrics.addr", c.Metrics.Handler(), logger); err != nil {
			return nil, err
		}
	}
	if cfg.API.EmbeddedWorker {
		if p.worker, err = newWorker(c); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// buildDoor builds the door and what follows a request past it: the
// idempotency keys, what gives back what a request holds, the liveness
// sweep, the follower and the waiting room.
func (p *apiProcess) buildDoor(bans *ban.Guard, addresses *iphash.Hasher) error {
	c, cfg, logger := p.core, p.core.cfg, p.core.logger
	idem := idempotency.New(c.Redis, cfg.Redis.KeyPrefix, cfg.API.IdempotencyTTL)
	returner := &holdings.Returner{Gate: c.Gate, Notifier: c.Notifier, Limiter: c.Limiter, Budgets: c.Budgets, Keys: idem,
		Metrics: c.Metrics, Logger: logger.With("component", "holdings")}
	p.sweeper = liveness.New(c.Temporal, cfg.Temporal.Namespace, c.Events, returner, logger.With("component", "liveness"))
	var err error
	p.follower, err = follow.New(follow.Options{
		Temporal: c.Temporal, Events: c.Events, Hub: p.hub, Gate: c.Gate, Liveness: p.sweeper,
		QueuePollInterval: cfg.API.QueuePollInterval, IdleTimeout: cfg.API.StreamIdleTimeout, StopTTL: cfg.Events.TTL,
		Logger: logger.With("component", "follow"),
	})
	if err != nil {
		return err
	}
	if p.room, err = door.NewRoom(cfg, c.Gate, c.Policy, logger.With("component", "waiting-room")); err != nil {
		return err
	}
	p.doorway, err = door.New(door.Options{
		Config: cfg, Temporal: c.Temporal, Events: c.Events, Hub: p.hub, Gate: c.Gate,
		Prompts: c.Prompts, Policy: c.Policy, Room: p.room, Idempotency: idem, Attacher: p.follower, Returner: returner,
		Limiter: c.Limiter, Budgets: c.Budgets, Bans: bans, KBs: c.KBs, Sessions: c.Sessions, Metrics: c.Metrics, Addresses: addresses,
		Logger: logger.With("component", "door"),
	})
	return err
}

// newBans is the abuse-ban guard of limits.ban; nil when it is off.
func newBans(c *Core, addresses *iphash.Hasher) (*ban.Guard, error) {
	b := c.cfg.Limits.Ban
	if !b.Enabled {
		return nil, nil
	}
	return ban.New(c.Redis, b.GuardOptions(c.cfg.Redis.KeyPrefix, addresses))
}

// run starts every loop of the API process, each until its context ends,
// and returns when all have: the event hub, the policy poll, the door's
// waiting room, the liveness sweep, the key cache's invalidations, the
// metrics listener, the embedded worker's loops and the HTTP server.
func (p *apiProcess) run(ctx context.Context, ready func(addr string)) error {
	// Shutdown order matters: stop taking requests and end open streams
	// (clients resume elsewhere with Last-Event-ID; their requests go on),
	// then stop the hub, then the worker, which lets running activities
	// finish. So the door (with the key cache), the hub and the worker get
	// contexts of their own, ended in that order once the HTTP server has
	// stopped.
	doorCtx, stopDoor := context.WithCancel(context.WithoutCancel(ctx))
	hubCtx, stopHub := context.WithCancel(context.WithoutCancel(ctx))
	workerCtx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.hub.Run(hubCtx) })
	g.Go(func() error {
		// A change made through any instance is in force here within this.
		p.core.Policy.Run(gctx, 500*time.Millisecond)
		return nil
	})
	g.Go(func() error {
		p.room.Run(doorCtx)
		return nil
	})
	g.Go(func() error {
		p.sweeper.Run(doorCtx)
		return nil
	})
	g.Go(func() error {
		p.keys.Run(doorCtx)
		return nil
	})
	if p.worker != nil {
		startWorker(workerCtx, g, p.core, p.worker, func() {})
	}
	if p.serveMetrics != nil {
		g.Go(func() error { return p.serveMetrics(gctx) })
	}
	g.Go(func() error {
		defer stopWorker()
		defer stopHub()
		defer stopDoor()
		return p.server.Run(gctx, ready, stopHub)
	})
	return g.Wait()
}
