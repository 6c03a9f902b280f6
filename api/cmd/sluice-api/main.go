// Command sluice-api serves Sluice's HTTP API, with an embedded Temporal
// worker unless api.embedded_worker is false.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-dev/sluice/api"
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
	err = api.RunProcess(ctx, cfg, logger, func(addr string) {
		logger.Info("api listening", "url", "http://"+addr)
	})
	stop()
	if err != nil {
		logger.Error("sluice-api stopped", "err", err)
		os.Exit(1)
	}
}
