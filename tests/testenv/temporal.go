package testenv

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
)

// TemporalBin finds the pinned Temporal CLI: $SLUICE_TEST_TEMPORAL_BIN, or
// bin/temporal at the repository root (make temporal builds it).
func TemporalBin() (string, error) {
	if p := os.Getenv("SLUICE_TEST_TEMPORAL_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("SLUICE_TEST_TEMPORAL_BIN=%s: %w", p, err)
		}
		return p, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, "bin", "temporal")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("temporal CLI not found at %s: run `make temporal` (or `make test`, which builds it)", p)
	}
	return p, nil
}

// DevServerArgs are the dynamic config values Sluice relies on; make run
// passes the same ones.
var DevServerArgs = []string{
	"--dynamic-config-value", "system.enableEagerWorkflowStart=true",
	"--dynamic-config-value", "system.enableActivityEagerExecution=true",
}

// LaunchTemporal starts the real Temporal dev server (in memory, on free
// ports) with the given Keyword search attributes registered. The caller
// must Stop it.
func LaunchTemporal(ctx context.Context, keywordAttrs []string) (*testsuite.DevServer, error) {
	bin, err := TemporalBin()
	if err != nil {
		return nil, err
	}
	attrs := make([]temporal.SearchAttributeUpdate, 0, len(keywordAttrs))
	for _, name := range keywordAttrs {
		attrs = append(attrs, temporal.NewSearchAttributeKeyKeyword(name).ValueSet(""))
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// Two tries, for the reason LaunchPersistentTemporal gives.
	for try := 0; ; try++ {
		srv, err := testsuite.StartDevServer(ctx, testsuite.DevServerOptions{
			ExistingPath:     bin,
			ClientOptions:    &client.Options{Namespace: "default"},
			LogLevel:         "error",
			SearchAttributes: temporal.NewSearchAttributes(attrs...),
			ExtraArgs:        DevServerArgs,
			Stdout:           os.Stderr,
			Stderr:           os.Stderr,
		})
		if err == nil {
			return srv, nil
		}
		if try == 1 || ctx.Err() != nil {
			return nil, fmt.Errorf("start temporal dev server (%s): %w", bin, err)
		}
		fmt.Fprintf(os.Stderr, "testenv: start temporal dev server: %v; trying again\n", err)
	}
}

// Temporal is a dev server that keeps its state in a SQLite file and its
// frontend on one port, so that a test can stop it and start it again
// and its clients find the same server, with every workflow it had, at
// the same address: a restarted server, not a new one.
type Temporal struct {
	// HostPort is the frontend's address; DBFile the SQLite file.
	HostPort string
	DBFile   string
	opts     testsuite.DevServerOptions
	srv      *testsuite.DevServer
}

// LaunchPersistentTemporal starts the pinned dev server with its database
// in dir, on a free loopback port, with the given Keyword search
// attributes registered; its output goes to log. The caller must Stop it
// before removing dir.
func LaunchPersistentTemporal(ctx context.Context, keywordAttrs []string, dir string, log io.Writer) (*Temporal, error) {
	bin, err := TemporalBin()
	if err != nil {
		return nil, err
	}
	attrs := make([]temporal.SearchAttributeUpdate, 0, len(keywordAttrs))
	for _, name := range keywordAttrs {
		attrs = append(attrs, temporal.NewSearchAttributeKeyKeyword(name).ValueSet(""))
	}
	// The dev server takes more ports than the one it is given (its
	// services' membership ports, picked free as it starts); with other
	// test packages starting servers at the same moment one of them can
	// be taken first, and the server panics. A second try, on a new port
	// and a new database file, does not meet the same race.
	for try := range 2 {
		var port int
		if port, err = FreePort(); err != nil {
			return nil, err
		}
		t := &Temporal{HostPort: fmt.Sprintf("127.0.0.1:%d", port), DBFile: filepath.Join(dir, fmt.Sprintf("temporal-%d.db", try))}
		t.opts = testsuite.DevServerOptions{
			ExistingPath:     bin,
			ClientOptions:    &client.Options{HostPort: t.HostPort, Namespace: "default"},
			DBFilename:       t.DBFile,
			LogLevel:         "error",
			SearchAttributes: temporal.NewSearchAttributes(attrs...),
			ExtraArgs:        DevServerArgs,
			Stdout:           log,
			Stderr:           log,
		}
		if err = t.Start(ctx); err == nil {
			return t, nil
		}
		fmt.Fprintf(log, "testenv: %v; trying again on another port\n", err)
	}
	return nil, err
}

// Start starts the server (again) on its port and database file and waits
// until it answers.
func (t *Temporal) Start(ctx context.Context) error {
	if t.srv != nil {
		return fmt.Errorf("temporal dev server on %s already running", t.HostPort)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := testsuite.StartDevServer(ctx, t.opts)
	if err != nil {
		return fmt.Errorf("start temporal dev server on %s (%s): %w", t.HostPort, t.DBFile, err)
	}
	t.srv = srv
	return nil
}

// Stop shuts the server down (SIGINT) and waits for it; its database file
// stays. Stopping a stopped server does nothing.
func (t *Temporal) Stop() error {
	if t.srv == nil {
		return nil
	}
	t.srv.Client().Close()
	err := t.srv.Stop()
	t.srv = nil
	if err != nil {
		return fmt.Errorf("stop temporal dev server on %s: %w", t.HostPort, err)
	}
	return nil
}
