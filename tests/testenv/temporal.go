package testenv

import (
	"context"
	"fmt"
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
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := testsuite.StartDevServer(ctx, testsuite.DevServerOptions{
		ExistingPath:     bin,
		ClientOptions:    &client.Options{Namespace: "default"},
		LogLevel:         "error",
		SearchAttributes: temporal.NewSearchAttributes(attrs...),
		ExtraArgs:        DevServerArgs,
		Stdout:           os.Stderr,
		Stderr:           os.Stderr,
	})
	if err != nil {
		return nil, fmt.Errorf("start temporal dev server (%s): %w", bin, err)
	}
	return srv, nil
}
