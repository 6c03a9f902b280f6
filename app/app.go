// Package app is Sluice's composition root: it builds each component of a
// process once, from one config, and runs it. The API process is the HTTP
// server, the door, the event hub, the live policy and, by default, an
// embedded worker; the worker process is the Temporal worker. The
// binaries (cmd/), the integration tests and the benchmarks all start
// processes through it.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
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
	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/pkg/version"
	"github.com/sluice-dev/sluice/worker"
	wfsignal "github.com/sluice-dev/sluice/workflows/signal"
)

// RunAPI runs a whole API process until ctx ends: the HTTP server, the
// event hub and, if api.embedded_worker is set, a Temporal worker in the
// same process so that eager workflow start can hand it the first workflow
// task. ready, if not nil, gets the bound HTTP address.
func RunAPI(ctx context.Context, cfg config.Config, logger *slog.Logger, ready func(addr string)) error {
	rt, err := worker.NewRuntime(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer rt.Close()
	hub := events.NewHub(rt.Redis, rt.Events, events.HubOptions{Logger: logger.With("component", "event-hub")})
	keyCache := keys.NewCache(keys.NewStore(rt.Redis, cfg.Redis.KeyPrefix),
		keys.CacheOptions{TTL: cfg.Auth.KeyCacheTTL, Logger: logger.With("component", "keys")})
	addresses := iphash.New([]byte(cfg.Privacy.IPHashKey))
	if addresses.UsesDevKey() {
		logger.Warn("privacy.ip_hash_key is not set: client addresses in Redis keys, bans and logs are hashed with a public key, " +
			"which anyone can reverse by hashing every IPv4 address; set it (the same on every instance) in production")
	}
	bans, err := newBans(rt, cfg, addresses)
	if err != nil {
		return err
	}
	idem := idempotency.New(rt.Redis, cfg.Redis.KeyPrefix, cfg.API.IdempotencyTTL)
	returner := &holdings.Returner{Gate: rt.Gate, Notifier: wfsignal.Notifier{Client: rt.Temporal}, Limiter: rt.Limiter,
		Budgets: rt.Budgets, Keys: idem, Logger: logger.With("component", "holdings")}
	sweeper := liveness.New(rt.Temporal, cfg.Temporal.Namespace, rt.Events, returner, logger.With("component", "liveness"))
	follower, err := follow.New(follow.Options{
		Temporal: rt.Temporal, Events: rt.Events, Hub: hub, Gate: rt.Gate, Liveness: sweeper,
		QueuePollInterval: cfg.API.QueuePollInterval, IdleTimeout: cfg.API.StreamIdleTimeout, StopTTL: cfg.Events.TTL,
		Logger: logger.With("component", "follow"),
	})
	if err != nil {
		return err
	}
	room, err := door.NewRoom(cfg, rt.Gate, rt.Policy, logger.With("component", "waiting-room"))
	if err != nil {
		return err
	}
	admit, err := door.New(door.Options{
		Config: cfg, Temporal: rt.Temporal, Events: rt.Events, Hub: hub, Gate: rt.Gate,
		Prompts: rt.Prompts, Policy: rt.Policy, Room: room, Attacher: follower,
		Idempotency: idem, Returner: returner,
		Limiter: rt.Limiter, Budgets: rt.Budgets, Bans: bans, KBs: rt.KBs, Sessions: rt.Sessions, Metrics: rt.Metrics, Addresses: addresses,
		Logger: logger.With("component", "door"),
	})
	if err != nil {
		return err
	}
	ingestSlots, err := semaphore.New(rt.Redis, semaphore.Options{
		Key: cfg.Redis.KeyPrefix + "ingest:permits", Limit: cfg.Ingest.MaxConcurrent,
		GroupLimit: cfg.Ingest.TenantPermits(), Lease: cfg.Ingest.Lease})
	if err != nil {
		return err
	}
	srv, err := api.New(api.Options{
		Config: cfg, Temporal: rt.Temporal, Redis: rt.Redis, Events: rt.Events, Gate: rt.Gate, Prompts: rt.Prompts,
		Policy: rt.Policy, Door: admit, Follow: follower, Addresses: addresses, KBs: rt.KBs, Ingester: rt.Ingester, IngestSlots: ingestSlots, Embeddings: rt.EmbedCache,
		Sessions: rt.Sessions, Usage: rt.Usage, Budgets: rt.Budgets, Metrics: rt.Metrics, Codec: rt.Codec, Keys: keyCache, Bans: bans, Tracer: rt.Tracer,
		Logger: logger.With("component", "api"),
	})
	if err != nil {
		return err
	}
	// Shutdown order matters: stop taking requests and end open streams
	// (clients resume elsewhere with Last-Event-ID; their requests go on),
	// then stop the hub, then the worker, which lets running activities
	// finish. So the hub and worker get contexts of their own.
	var serveMetrics func(context.Context) error
	if cfg.Metrics.Addr != "" {
		if serveMetrics, err = metricsServer(cfg.Metrics.Addr, "metrics.addr", rt.Metrics.Handler(), logger); err != nil {
			return err
		}
	}
	hubCtx, stopHub := context.WithCancel(context.WithoutCancel(ctx))
	workerCtx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	// The waiting room and the liveness sweep serve the streams the HTTP
	// server still writes while it shuts down: they stop after it.
	doorCtx, stopDoor := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return hub.Run(hubCtx) })
	g.Go(func() error { room.Run(doorCtx); return nil })
	g.Go(func() error { sweeper.Run(doorCtx); return nil })
	g.Go(func() error {
		// A change made through any instance is in force here within this.
		rt.Policy.Run(gctx, 500*time.Millisecond)
		return nil
	})
	if cfg.API.EmbeddedWorker {
		g.Go(func() error { return rt.Run(workerCtx) })
	}
	if serveMetrics != nil {
		g.Go(func() error { return serveMetrics(gctx) })
	}
	g.Go(func() error {
		defer stopWorker()
		defer stopHub()
		defer stopDoor()
		return srv.Run(gctx, ready, stopHub)
	})
	return g.Wait()
}

// newBans is the abuse-ban guard of limits.ban; nil when it is off.
func newBans(rt *worker.Runtime, cfg config.Config, addresses *iphash.Hasher) (*ban.Guard, error) {
	b := cfg.Limits.Ban
	if !b.Enabled {
		return nil, nil
	}
	return ban.New(rt.Redis, ban.Options{KeyPrefix: cfg.Redis.KeyPrefix, Threshold: b.Threshold,
		Window: b.Window, Duration: b.Duration, Exempt: b.ExemptPrefixes(), Addresses: addresses})
}

// RunWorker runs a worker process until ctx ends, serving its metrics on
// metrics.worker_addr when set.
func RunWorker(ctx context.Context, cfg config.Config, logger *slog.Logger) error {
	rt, err := worker.NewRuntime(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer rt.Close()
	if cfg.Metrics.WorkerAddr == "" {
		return rt.Run(ctx)
	}
	serve, err := metricsServer(cfg.Metrics.WorkerAddr, "metrics.worker_addr", rt.Metrics.Handler(), logger)
	if err != nil {
		return err
	}
	mctx, stopMetrics := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- serve(mctx) }()
	runErr := rt.Run(ctx)
	stopMetrics()
	return errors.Join(runErr, <-served)
}

// metricsServer listens on addr (field names the setting in errors) and
// returns what serves GET /metrics there until its context ends: the
// worker's metrics, or the API's when metrics.addr keeps them off the
// public port.
func metricsServer(addr, field string, h http.Handler, logger *slog.Logger) (func(context.Context) error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s (%s): %w", addr, field, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	logger.Info("metrics served", "addr", ln.Addr().String())
	return func(ctx context.Context) error {
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		select {
		case err := <-served:
			return fmt.Errorf("serve metrics: %w", err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve metrics: %w", err)
		}
		return nil
	}, nil
}

// Run is a process's life from its command line (args, after the
// program's name) and returns the exit code: it prints the version if
// asked (version, -version; 0), loads the config from -config (2 if it is
// bad; 0 for -h), starts tracing if the OTEL_* environment asks for it
// (pkg/tracing; 2 if it is bad), runs run until SIGINT or SIGTERM, and
// returns 1 if run failed. name is the process's in logs and traces.
func Run(name string, args []string, run func(ctx context.Context, cfg config.Config, logger *slog.Logger) error) int {
	if version.Asked(args) {
		fmt.Println(version.Line(name))
		return 0
	}
	cfg, err := config.FromCommandLine(name, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	logger := worker.NewLogger(cfg.Log)
	b := version.Get()
	logger.Info(name+" starting", "version", b.Version, "commit", b.Commit, "go_version", b.GoVersion)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopTracing, err := tracing.Start(ctx, name, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	err = run(ctx, cfg, logger)
	stop()
	// The last spans are flushed before the process exits.
	tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if terr := stopTracing(tctx); terr != nil {
		logger.Warn("flush traces", "err", terr)
	}
	cancel()
	if err != nil {
		logger.Error(name+" stopped", "err", err)
		return 1
	}
	return 0
}

// API is an API process running in the background of another program: a
// test's or a benchmark's stack.
type API struct {
	// URL is where it listens ("http://host:port").
	URL  string
	stop context.CancelFunc
	done chan error
}

// StartAPI runs RunAPI in the background until Stop (ctx bounds only the
// wait for it to listen) and returns once it listens.
func StartAPI(ctx context.Context, cfg config.Config, logger *slog.Logger) (*API, error) {
	actx, stop := context.WithCancel(context.WithoutCancel(ctx))
	a := &API{stop: stop, done: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() { a.done <- RunAPI(actx, cfg, logger, func(addr string) { ready <- addr }) }()
	select {
	case addr := <-ready:
		a.URL = "http://" + addr
		return a, nil
	case err := <-a.done:
		stop()
		return nil, fmt.Errorf("api process: %w", err)
	case <-ctx.Done():
		stop()
		return nil, fmt.Errorf("api process not ready: %w", ctx.Err())
	}
}

// Stop ends the API process and waits up to wait for it to return.
func (a *API) Stop(wait time.Duration) error {
	a.stop()
	select {
	case err := <-a.done:
		return err
	case <-time.After(wait):
		return fmt.Errorf("api process did not stop within %s", wait)
	}
}
