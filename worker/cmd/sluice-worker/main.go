// Command sluice-worker runs a Temporal worker for Sluice's chat workflows
// and activities, and the admission janitor.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/worker"
	"github.com/sluice-dev/sluice/worker/process"
)

func main() {
	cfg, err := config.FromCommandLine("sluice-worker", os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	logger := worker.NewLogger(cfg.Log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = process.RunWorker(ctx, cfg, logger)
	stop()
	if err != nil {
		logger.Error("sluice-worker stopped", "err", err)
		os.Exit(1)
	}
}
