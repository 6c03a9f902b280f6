// Package worker runs Sluice's Temporal worker: it registers the chat and
// healing workflows and their activities and runs them, starts the
// deployment's healer, and runs the admission janitor that pumps the
// queues. It is given every dependency; package app builds them.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/workflows"
)

// Worker is the Temporal worker of a process, API (embedded) or worker.
type Worker struct {
	cfg      config.Config
	temporal client.Client
	gate     *admission.Gate
	chat     *activities.Chat
	healing  *activities.Healing
	logger   *slog.Logger
	// restart notices a Redis that lost Sluice's state (the janitor's).
	restart restartWatch
}

// Options are the Worker's dependencies, each built once by the process
// that runs it (package app).
type Options struct {
	// Config gives the worker its task queue and limits (temporal.*), the
	// workflow cache's size and the healer's settings (healing.*).
	Config   config.Config
	Temporal client.Client
	// Gate is the admission gate whose queues the janitor pumps.
	Gate *admission.Gate
	// Chat and Healing are the activities the workflows call; the janitor
	// wakes waiters through Chat's notifier.
	Chat    *activities.Chat
	Healing *activities.Healing
	Logger  *slog.Logger
}

// New returns the worker; nothing runs until Run and RunJanitor.
func New(opts Options) (*Worker, error) {
	if opts.Temporal == nil || opts.Gate == nil || opts.Chat == nil {
		return nil, errors.New("worker: Temporal, Gate and Chat are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Worker{cfg: opts.Config, temporal: opts.Temporal, gate: opts.Gate, chat: opts.Chat, healing: opts.Healing,
		logger: opts.Logger}, nil
}

// newTemporalWorker returns a Temporal worker with the chat workflow and
// its activities registered.
func (w *Worker) newTemporalWorker() sdkworker.Worker {
	cfg := w.cfg.Temporal
	// The cache is the process's, shared by its workers and sized when
	// the first of them is made: without a bound of our own it is the
	// SDK's 10,000 workflows, which the API's embedded worker fills with
	// workflows that went on to finish on other workers, each holding its
	// state and goroutines until pushed out.
	sdkworker.SetStickyWorkflowCacheSize(w.cfg.WorkflowCacheSize())
	tw := sdkworker.New(w.temporal, cfg.TaskQueue, sdkworker.Options{
		MaxConcurrentActivityExecutionSize:      cfg.MaxConcurrentActivities,
		MaxConcurrentWorkflowTaskExecutionSize:  cfg.MaxConcurrentWorkflowTasks,
		MaxConcurrentLocalActivityExecutionSize: 1000,
		WorkerStopTimeout:                       cfg.WorkerStopTimeout,
		// A request that failed because Redis or another dependency was
		// out of reach is told to retry, not that Sluice failed.
		Interceptors: []interceptor.WorkerInterceptor{activities.UnavailableInterceptor()},
	})
	Register(tw, w.chat, w.healing)
	return tw
}

// Register registers Sluice's workflows and activities on w. Activities
// are named by their method names, so Chat's and Healing's must not
// collide (registering would panic).
func Register(w sdkworker.Registry, acts *activities.Chat, healing *activities.Healing) {
	w.RegisterWorkflowWithOptions(workflows.ChatWorkflow, workflow.RegisterOptions{Name: workflows.ChatWorkflowName})
	w.RegisterWorkflowWithOptions(workflows.HealingWorkflow, workflow.RegisterOptions{Name: workflows.HealingWorkflowName})
	w.RegisterActivity(acts)
	if healing != nil {
		w.RegisterActivity(healing)
	}
}

// Run runs the Temporal worker until ctx ends, then stops it, which lets
// running activities finish (temporal.worker_stop_timeout). Once the
// worker polls, it starts the healer (StartHealing), which runs on it.
func (w *Worker) Run(ctx context.Context) error {
	tw := w.newTemporalWorker()
	if err := tw.Start(); err != nil {
		return fmt.Errorf("start temporal worker on %s: %w", w.cfg.Temporal.TaskQueue, err)
	}
	defer tw.Stop()
	w.logger.Info("worker started", "taskQueue", w.cfg.Temporal.TaskQueue, "temporal", w.cfg.Temporal.HostPort)
	// A healer that cannot start is logged, not fatal: chat requests do
	// not need it, and the next worker start tries again.
	if err := StartHealing(ctx, w.temporal, w.cfg, w.logger); err != nil {
		w.logger.Error("start the healer", "err", err)
	}
	<-ctx.Done()
	return nil
}

// RunJanitor reclaims expired permits every second and wakes the waiters
// they go to, until ctx ends; without it a crashed holder's slot would sit
// idle until the next release or the waiters' own re-check. It also
// notices a Redis that lost the queues (checkRedisState).
func (w *Worker) RunJanitor(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.checkRedisState(ctx)
			for _, pool := range w.gate.Pools() {
				woken, err := w.gate.Pump(ctx, pool)
				if err != nil {
					if ctx.Err() == nil {
						w.logger.Warn("admission janitor", "pool", pool, "err", err)
					}
					continue
				}
				if err := admission.Wake(ctx, w.gate, w.chat.Notifier, woken); err != nil {
					w.logger.Warn("admission janitor wake", "pool", pool, "err", err)
				}
			}
		}
	}
}
