package budget

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/pkg/usage"
)

// FromLedger rebuilds a tenant's month from the usage ledger: its tokens,
// and its spend with the tokens of each pool and model that answered
// priced as Settle prices them (prices.At).
func FromLedger(ledger usage.Store, prices Prices) Rebuild {
	return func(ctx context.Context, tenant string, from, to time.Time) (Used, error) {
		rows, err := ledger.Query(ctx, usage.Query{Tenant: tenant, From: from, To: to, GroupBy: usage.GroupPool})
		if err != nil {
			return Used{}, fmt.Errorf("sum %s's usage by pool and model: %w", tenant, err)
		}
		var u Used
		for _, r := range rows {
			u.Tokens += r.PromptTokens + r.CompletionTokens
			u.Micros += prices.At(r.Group, r.Model).Micros(r.PromptTokens, r.CompletionTokens)
		}
		return u, nil
	}
}
