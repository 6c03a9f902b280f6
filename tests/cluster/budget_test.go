package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/budget"
)

// The monthly budgets' reserve (with a rebuild) and settle scripts, and the
// status read, over tenants whose months land on different slots.
func TestBudget(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	c := budget.New(rdb, budget.Options{KeyPrefix: prefix, Rebuild: func(context.Context, string, time.Time, time.Time) (budget.Used, error) {
		return budget.Used{Tokens: 100}, nil
	}})
	lim := budget.Limit{Tokens: 1000, Micros: 1_000_000}
	for _, tenant := range []string{"acme", "globex", "initech"} {
		d, err := c.Reserve(ctx, budget.Charge{Tenant: tenant, RequestID: "r-" + tenant, PromptTokens: 200, OutputTokens: 100,
			Price: budget.Price{Input: 1, Output: 2}}, lim)
		ok(t, "reserve for "+tenant, err)
		if !d.Allowed || d.Used.Tokens != 400 {
			t.Fatalf("%s: %+v, want allowed with the rebuilt 100 and 300 charged", tenant, d)
		}
		settled, err := c.Settle(ctx, d.Reservation, budget.Use{PromptTokens: 50, CompletionTokens: 10})
		ok(t, "settle for "+tenant, err)
		s, err := c.Status(ctx, tenant, lim)
		ok(t, "status of "+tenant, err)
		if !settled.Settled || s.Used.Tokens != 160 {
			t.Fatalf("%s: settled %+v, used %+v, want 160 tokens", tenant, settled, s.Used)
		}
	}
}
