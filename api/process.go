package api

import (
	"context"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/worker"
)

// RunProcess runs a whole API process until ctx ends: the HTTP server, the
// event hub and, if api.embedded_worker is set, a Temporal worker in the
// same process so that eager workflow start can hand it the first workflow
// task. ready, if not nil, gets the bound HTTP address.
func RunProcess(ctx context.Context, cfg config.Config, logger *slog.Logger, ready func(addr string)) error {
	rt, err := worker.NewRuntime(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer rt.Close()
	hub := events.NewHub(rt.Redis, rt.Events, events.HubOptions{Logger: logger.With("component", "event-hub")})
	live := policy.NewStore(rt.Redis, cfg, rt.Gate, logger.With("component", "policy"))
	srv, err := New(Options{
		Config: cfg, Temporal: rt.Temporal, Redis: rt.Redis, Events: rt.Events, Hub: hub,
		Gate: rt.Gate, Prompts: rt.Prompts, Limiter: rt.Limiter, Policy: live, KBs: rt.KBs, Ingester: rt.Ingester, Sessions: rt.Sessions, Metrics: rt.Metrics,
		Logger: logger.With("component", "api"),
	})
	if err != nil {
		return err
	}
	// Shutdown order matters: stop taking requests and end open streams
	// (clients resume elsewhere with Last-Event-ID; their requests go on),
	// then stop the hub, then the worker, which lets running activities
	// finish. So the hub and worker get contexts of their own.
	hubCtx, stopHub := context.WithCancel(context.WithoutCancel(ctx))
	workerCtx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return hub.Run(hubCtx) })
	g.Go(func() error {
		// A change made through any instance is in force here within this.
		live.Run(gctx, 500*time.Millisecond)
		return nil
	})
	if cfg.API.EmbeddedWorker {
		g.Go(func() error { return rt.Run(workerCtx) })
	}
	g.Go(func() error {
		defer stopWorker()
		defer stopHub()
		return srv.Run(gctx, ready, stopHub)
	})
	return g.Wait()
}
