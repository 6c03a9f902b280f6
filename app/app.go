// Package app is Sluice's composition root: it builds each component of a
// process once, from one config, and runs every loop of it under one
// errgroup tied to the process's context. Each process has one file that
// builds its components and starts its loops: api.go (the HTTP server,
// the door, the event hub, the live policy and, by default, an embedded
// worker) and worker.go (the Temporal worker). What both build — the
// connections, the stores in Redis, the activities — is Build (build.go).
// The binaries (cmd/), the integration tests and the benchmarks all start
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
	"strings"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/pkg/version"
)

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

// NewLogger builds the process logger from config.
func NewLogger(cfg config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(cfg.Level)))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
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
	logger := NewLogger(cfg.Log)
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
