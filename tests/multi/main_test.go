// Package multi runs Sluice as it is deployed for availability: two API
// processes and two worker processes, real OS processes built by
// `make build`, on a real Temporal server (PostgreSQL behind it) and a
// real Redis Cluster of three masters and three replicas, with the LLM
// simulator behind both pools; everything on loopback. The tests check
// what a second instance promises: that the concurrency limit holds
// across every process that admits requests, that a client whose API
// process died resumes its stream on the other one without losing or
// repeating a token, and that the activities of a worker killed with
// SIGKILL move to the other worker.
//
// The stack takes about a minute to start, so the tests run only with
// SLUICE_MULTI=1: `make test-cluster` runs them.
package multi

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// the is the stack every test shares; nil when the tests are skipped.
var the *stack

func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_MULTI") != "1" {
		os.Exit(m.Run())
	}
	if goodputMode() {
		shortLimit = goodputPermits
	}
	var opts launchOptions
	if fairnessMode() {
		f, err := prepareFairness()
		if err != nil {
			fmt.Fprintln(os.Stderr, "prepare the fairness replay:", err)
			os.Exit(1)
		}
		theFairness, opts = f, f.launchOptions()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	s, err := launchStack(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the multi-instance stack:", err)
		if s != nil {
			s.close(true)
		}
		os.Exit(1)
	}
	the = s
	code := m.Run()
	s.close(code != 0)
	os.Exit(code)
}

// stackFor returns the shared stack, or skips the test without one.
func stackFor(t *testing.T) *stack {
	t.Helper()
	if the == nil {
		t.Skip("multi-instance tests need SLUICE_MULTI=1: `make test-cluster` runs them")
	}
	return the
}
