package activities_test

import (
	"testing"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/request"
)

// The admission activity passes the tier's concurrency cap and the
// request's tokens to the gate: a tenant at its cap queues although
// permits are free, and is granted when it gives one back.
func TestAdmitEnforcesTheTenantsConcurrencyCap(t *testing.T) {
	h := newHarness(t, nil)
	admit := func(id string) activities.AdmitOutput {
		return mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
			RequestID: id, Query: query, Tenant: "acme", Weight: 2, MaxConcurrent: 1, Tokens: 900,
		})
	}
	if out := admit("r1"); !out.Granted {
		t.Fatalf("r1: %+v, want granted", out)
	}
	out := admit("r2")
	if out.Granted || out.Position != 1 {
		t.Fatalf("r2 over acme's cap of 1: %+v, want queued first", out)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want 1 in use (permits free) and r2 waiting", s)
	}
	rel, err := h.gate.Release(t.Context(), request.PoolShort, "r1")
	if err != nil || len(admission.IDs(rel.Woken)) != 1 || admission.IDs(rel.Woken)[0] != "r2" {
		t.Fatalf("release r1 = %+v (%v), want r2 granted", rel, err)
	}
}
