package app

import (
	"context"
	"log/slog"

	"golang.org/x/sync/errgroup"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/worker"
)

// RunWorker runs a worker process until ctx ends, serving its metrics on
// metrics.worker_addr when set.
func RunWorker(ctx context.Context, cfg config.Config, logger *slog.Logger) error {
	core, err := Build(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer core.Close()
	w, err := newWorker(core)
	if err != nil {
		return err
	}
	var serveMetrics func(context.Context) error
	if cfg.Metrics.WorkerAddr != "" {
		if serveMetrics, err = metricsServer(cfg.Metrics.WorkerAddr, "metrics.worker_addr", core.Metrics.Handler(), logger); err != nil {
			return err
		}
	}
	// The metrics are served until the worker has stopped and its last
	// latencies are flushed, so that a scrape during the stop sees it.
	metricsCtx, stopMetrics := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(ctx)
	if serveMetrics != nil {
		g.Go(func() error { return serveMetrics(metricsCtx) })
	}
	startWorker(gctx, g, core, w, stopMetrics)
	return g.Wait()
}

// newWorker is the process's Temporal worker over its core's activities.
func newWorker(c *Core) (*worker.Worker, error) {
	return worker.New(worker.Options{Config: c.cfg, Temporal: c.Temporal, Gate: c.Gate, Chat: c.Chat, Healing: c.Healing,
		Logger: c.logger})
}

// startWorker starts a worker's loops in g, each until ctx ends: the
// Temporal worker (which starts the healer once it polls), the admission
// janitor, the kb keeper, the expired files' sweep, and the latency
// window's flusher, which stops
// only after the Temporal worker has, so that the requests it finishes
// while stopping are flushed too; stopped is called after that last
// flush. The API process starts its embedded worker with it too.
func startWorker(ctx context.Context, g *errgroup.Group, c *Core, w *worker.Worker, stopped func()) {
	latencyCtx, stopLatency := context.WithCancel(context.WithoutCancel(ctx))
	g.Go(func() error {
		defer stopped()
		if err := c.Latency.Run(latencyCtx); err != nil {
			c.logger.Warn("last latency flush", "err", err)
		}
		return nil
	})
	g.Go(func() error {
		defer stopLatency()
		return w.Run(ctx)
	})
	g.Go(func() error { return w.RunJanitor(ctx) })
	g.Go(func() error {
		c.keeper.run(ctx)
		return nil
	})
	if c.Files != nil {
		g.Go(func() error {
			c.sweepFiles(ctx)
			return nil
		})
	}
}
