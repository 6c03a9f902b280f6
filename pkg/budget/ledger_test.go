package budget

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/usage"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// A month rebuilt from the ledger counts every token of the tenant's
// month, and prices each pool's tokens by that pool's price.
func TestFromLedgerPricesEachPool(t *testing.T) {
	ctx := context.Background()
	ledger, err := usage.OpenSQLite(ctx, usage.SQLiteOptions{Path: filepath.Join(t.TempDir(), "usage.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ledger.Close() })
	from, to := Month(now)
	entries := []usage.Entry{
		{Tenant: "acme", Pool: "short", PromptTokens: 100, CompletionTokens: 10, FinishedAt: now},
		{Tenant: "acme", Pool: "long", PromptTokens: 1000, CompletionTokens: 100, FinishedAt: now},
		{Tenant: "acme", Pool: "short", PromptTokens: 50, CompletionTokens: 5, FinishedAt: now},
		{Tenant: "other", Pool: "short", PromptTokens: 7, CompletionTokens: 7, FinishedAt: now},
		{Tenant: "acme", Pool: "short", PromptTokens: 9, CompletionTokens: 9, FinishedAt: from.AddDate(0, 0, -1)},
	}
	for i, e := range entries {
		e.RequestID, e.Route, e.Outcome = fmt.Sprintf("chat-%d", i), e.Pool, "done"
		if _, err := ledger.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	prices := Prices{Pools: map[string]Price{"short": {Input: 1, Output: 2}, "long": {Input: 3, Output: 4}}}
	got, err := FromLedger(ledger, prices)(ctx, "acme", from, to)
	if err != nil {
		t.Fatal(err)
	}
	// short: 150 in, 15 out at 1 and 2; long: 1000 in, 100 out at 3 and 4.
	if want := (Used{Tokens: 1265, Micros: 150 + 30 + 3000 + 400}); got != want {
		t.Fatalf("rebuilt %+v, want %+v", got, want)
	}
}

// A fallback's answer is priced at the model that answered, by Settle
// and by a month rebuilt from the ledger alike; a request is reserved at
// the dearest model that may answer in its pool.
func TestFallbackAnswerIsPricedAtTheModelThatAnswered(t *testing.T) {
	ctx := context.Background()
	ledger, err := usage.OpenSQLite(ctx, usage.SQLiteOptions{Path: filepath.Join(t.TempDir(), "usage.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ledger.Close() })
	prices := Prices{
		Models:    map[string]Price{"small": {Input: 1, Output: 2}, "large": {Input: 10, Output: 20}},
		Pools:     map[string]Price{"short": {Input: 10, Output: 20}, "long": {Input: 1, Output: 2}},
		Fallbacks: map[string][]string{"short": {"small"}, "long": {"large"}},
	}
	for pool, want := range map[string]Price{"short": {Input: 10, Output: 20}, "long": {Input: 10, Output: 20}} {
		if b := prices.Bound(pool); b != want {
			t.Fatalf("%s's requests reserved at %+v, want large's price %+v", pool, b, want)
		}
	}
	from, to := Month(now)
	c := New(srv.Client(t), Options{KeyPrefix: testenv.KeyPrefix(t), Prices: prices, Rebuild: FromLedger(ledger, prices),
		Now: func() time.Time { return now }})
	lim := Limit{Micros: 1_000_000}
	d, err := c.Reserve(ctx, Charge{Tenant: "acme", RequestID: "r1", PromptTokens: 100, OutputTokens: 10, Price: prices.Bound("short")}, lim)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	// short's model, large, could not answer; its fallback, small, did.
	e := usage.Entry{RequestID: "r1", Tenant: "acme", Pool: "short", Model: "small", Route: "short", Outcome: "done",
		PromptTokens: 100, CompletionTokens: 10, FinishedAt: now}
	if _, err := c.Settle(ctx, d.Reservation, Use{PromptTokens: 100, CompletionTokens: 10, Pool: e.Pool, Model: e.Model}); err != nil {
		t.Fatal(err)
	}
	settled, err := c.Status(ctx, "acme", lim)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.Record(ctx, e); err != nil {
		t.Fatal(err)
	}
	rebuilt, err := FromLedger(ledger, prices)(ctx, "acme", from, to)
	if err != nil {
		t.Fatal(err)
	}
	// 100 in and 10 out at small's 1 and 2.
	want := Used{Tokens: 110, Micros: 120}
	if settled.Used != want || rebuilt != want {
		t.Fatalf("settled %+v, rebuilt %+v; want both %+v", settled.Used, rebuilt, want)
	}
}
