package door

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/tracing"
)

// LimitOf is a tier's budget in the counter's terms.
func LimitOf(t policy.Tier) budget.Limit {
	return budget.Limit{Tokens: t.Budget.TokensPerMonth, Micros: budget.MicrosOf(t.Budget.SpendPerMonthUSD)}
}

// reserveBudget charges the request's upper bound (a.tokens: its prompt's
// bound and every output token it may produce, priced at the dearest
// model that may answer in its pool, budget.Prices.Bound) to its tenant's monthly budget, and notes the month in st.
// A tier without a budget costs nothing: no Redis call. It refuses with
// budget_exceeded (Limited), naming the limit and when the month resets.
func (d *Door) reserveBudget(ctx context.Context, st *Standing, a arrival, req *Request) (string, error) {
	lim := LimitOf(a.tier)
	if d.budgets == nil || !lim.On() {
		return "", nil
	}
	output := int64(max(req.Choices, 1) * (*req.MaxTokens))
	ch := budget.Charge{Tenant: a.who.Tenant, RequestID: a.id, PromptTokens: int64(a.tokens) - output, OutputTokens: output,
		Price: d.budgets.Prices().Bound(a.pool)}
	dec, err := d.budgets.Reserve(ctx, ch, lim)
	if err != nil {
		d.logger.Error("reserve monthly budget", "requestID", a.id, "err", err)
		go d.giveBack(ctx, holdings.Holdings{RequestID: a.id, Budget: dec.Reservation})
		return "", refusal.Unreachable("the budget counter is unavailable; please retry")
	}
	st.noteMonth(dec)
	for _, kind := range dec.Warn {
		d.metrics.BudgetWarning(kind)
		d.logger.LogAttrs(ctx, slog.LevelWarn, "tenant passed 80% of its monthly budget", slog.String("tenant", a.who.Tenant),
			slog.String("kind", kind), slog.Int64("tokens_used", dec.Used.Tokens), slog.Int64("tokens_limit", lim.Tokens),
			slog.Float64("spend_used_usd", budget.USD(dec.Used.Micros)), slog.Float64("spend_limit_usd", budget.USD(lim.Micros)),
			slog.String("requestID", a.id), slog.String("trace_id", tracing.TraceID(ctx)))
	}
	if dec.Allowed {
		return dec.Reservation, nil
	}
	return "", budgetExceeded(dec, time.Now())
}

// budgetExceeded is the refusal of a request dec refused, told at now.
func budgetExceeded(dec budget.Decision, now time.Time) *refusal.Error {
	reset := dec.ResetsAt.Format(time.RFC3339)
	var msg string
	if dec.Refused == budget.KindSpend {
		msg = fmt.Sprintf("this request could cost up to the rest of your organisation's monthly spend budget of $%.2f ($%.2f used); it resets at %s",
			budget.USD(dec.Limit.Micros), budget.USD(dec.Used.Micros), reset)
	} else {
		msg = fmt.Sprintf("this request could take more than the rest of your organisation's monthly budget of %d tokens (%d used); it resets at %s",
			dec.Limit.Tokens, dec.Used.Tokens, reset)
	}
	return &refusal.Error{Class: refusal.Limited, Code: request.ReasonBudgetExceeded, Dimension: "tenant", Kind: dec.Refused,
		RetryAfter: request.RetryAfterSeconds(dec.ResetsAt.Sub(now)), Message: msg + "; lower max_tokens or ask for a larger plan"}
}
