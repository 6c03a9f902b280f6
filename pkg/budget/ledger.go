package budget

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/pkg/usage"
)

// FromLedger rebuilds a tenant's month from the usage ledger: its tokens,
// and its spend with each pool's tokens priced by prices (by pool, as
// Options.Prices).
func FromLedger(ledger usage.Store, prices map[string]Price) Rebuild {
	return func(ctx context.Context, tenant string, from, to time.Time) (Used, error) {
		rows, err := ledger.Query(ctx, usage.Query{Tenant: tenant, From: from, To: to, GroupBy: usage.GroupPool})
		if err != nil {
			return Used{}, fmt.Errorf("sum %s's usage by pool: %w", tenant, err)
		}
		var u Used
		for _, r := range rows {
			u.Tokens += r.PromptTokens + r.CompletionTokens
			u.Micros += prices[r.Group].Micros(r.PromptTokens, r.CompletionTokens)
		}
		return u, nil
	}
}
