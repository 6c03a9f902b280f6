package api

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
)

// The workflow starts with the prompt's bound as its admission cost (its
// output is charged as it streams, whatever max_tokens it asks), and its
// tier's concurrency cap.
func TestStartCarriesTokensAndConcurrencyCap(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) { c.Auth.APIKeys[0].Tier = "free" })
	post(srv, `{"query":"hello","max_tokens":100}`)
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if len(tc.inputs) != 1 {
		t.Fatalf("%d workflow starts, want 1", len(tc.inputs))
	}
	in := tc.inputs[0]
	bound := srv.prompts.BoundForQueryTokens(srv.prompts.QueryTokens("hello"), srv.cfg.Retrieval.TopK, srv.cfg.Retrieval.ChunkTokens)
	if in.AdmissionTokens != bound {
		t.Errorf("admission tokens %d, want the prompt's bound %d", in.AdmissionTokens, bound)
	}
	if want := srv.cfg.Limits.Tiers["free"].MaxConcurrent; in.Settings.MaxConcurrent != want || want == 0 {
		t.Errorf("settings carry max concurrent %d, want free's %d", in.Settings.MaxConcurrent, want)
	}
}

// Entries parked behind their tenant's concurrency cap do not count as
// the pool's backlog: with a permit free, another tenant's request starts
// although the queue holds as many entries as the pool has permits.
func TestParkedEntriesDoNotHoldTheDoor(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.Pools.Short.MaxConcurrency = 2
		c.API.QueuePerPermit = 1
	})
	runHub(t, srv)
	ctx := context.Background()
	if err := srv.gate.SetLimit(ctx, "short", 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := srv.gate.Enqueue(ctx, "short", admission.Request{ID: fmt.Sprint("o", i), Tenant: "other", Weight: 1, MaxConcurrent: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if total, _, _ := srv.gate.Depth(ctx, "short", ""); total != 2 {
		t.Fatalf("queue depth %d, want other's 2 parked entries", total)
	}
	go post(srv, `{"query":"hello","max_tokens":8}`)
	waitFor(t, "acme's workflow to start past other's parked entries", func() bool { return tc.starts.Load() == 1 })
}
