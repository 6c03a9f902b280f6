// Command sluice-api serves Sluice's HTTP API, with an embedded Temporal
// worker unless api.embedded_worker is false.
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
	cfg, err := config.FromCommandLine("sluice-api", os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	logger := worker.NewLogger(cfg.Log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = process.RunAPI(ctx, cfg, logger, func(addr string) {
		logger.Info("api listening", "url", "http://"+addr)
	})
	stop()
	if err != nil {
		logger.Error("sluice-api stopped", "err", err)
		os.Exit(1)
	}
}
