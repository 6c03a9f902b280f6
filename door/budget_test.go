package door

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// A spend refusal names the dollar budget, what is used and the reset,
// with Retry-After to the reset.
func TestBudgetExceededNamesTheLimitAndTheReset(t *testing.T) {
	now := time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC)
	dec := budget.Decision{Refused: budget.KindSpend, Limit: budget.Limit{Micros: 5_000_000}, Used: budget.Used{Micros: 4_990_000},
		ResetsAt: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)}
	e := budgetExceeded(dec, now)
	if e.Class != refusal.Limited || e.Code != request.ReasonBudgetExceeded || e.Kind != "spend" || e.RetryAfter != 3600 {
		t.Fatalf("refusal %+v, want 429 budget_exceeded, kind spend, retry in 3600 s", e)
	}
	for _, want := range []string{"$5.00", "$4.99 used", "2027-01-01T00:00:00Z"} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("message %q lacks %q", e.Message, want)
		}
	}
}

func TestLimitOfATier(t *testing.T) {
	got := LimitOf(policy.Tier{Budget: policy.Budget{TokensPerMonth: 1000, SpendPerMonthUSD: 2.5}})
	if got != (budget.Limit{Tokens: 1000, Micros: 2_500_000}) {
		t.Fatalf("limit %+v", got)
	}
	if LimitOf(policy.Tier{}).On() {
		t.Fatal("a tier without a budget is limited")
	}
}
