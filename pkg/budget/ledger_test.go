package budget

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/sluice-dev/sluice/pkg/usage"
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
	prices := map[string]Price{"short": {Input: 1, Output: 2}, "long": {Input: 3, Output: 4}}
	got, err := FromLedger(ledger, prices)(ctx, "acme", from, to)
	if err != nil {
		t.Fatal(err)
	}
	// short: 150 in, 15 out at 1 and 2; long: 1000 in, 100 out at 3 and 4.
	if want := (Used{Tokens: 1265, Micros: 150 + 30 + 3000 + 400}); got != want {
		t.Fatalf("rebuilt %+v, want %+v", got, want)
	}
}
