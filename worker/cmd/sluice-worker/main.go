// Command sluice-worker runs a Temporal worker for Sluice's chat workflows
// and activities, and the admission janitor.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/worker"
)

func main() {
	configPath := flag.String("config", os.Getenv("SLUICE_CONFIG"), "YAML config file (env SLUICE_CONFIG); SLUICE_* variables override it")
	flag.Parse()
	cfg, err := config.Load(*configPath, os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	logger := worker.NewLogger(cfg.Log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg)
	stop()
	if err != nil {
		logger.Error("sluice-worker stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config.Config) error {
	rt, err := worker.NewRuntime(ctx, cfg, worker.NewLogger(cfg.Log))
	if err != nil {
		return err
	}
	defer rt.Close()
	return rt.Run(ctx)
}
