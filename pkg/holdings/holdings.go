// Package holdings is what a chat request holds between the door and its
// end — a permit or queue entry in a pool, a place in a pool's fair order
// reserved at the door, a rate-limit reservation, a monthly budget charge
// and an Idempotency-Key claim — and the one path that gives them back
// (Returner.GiveBack). The door gives back what a request that never
// started holds, the workflow's Finalize what a finished one holds, and
// the liveness sweep what one whose workflow vanished holds.
package holdings

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Holdings is what one request holds. The zero value holds nothing.
type Holdings struct {
	RequestID string
	// Pools are the pools where it may hold a permit or a queue entry.
	// Releases are idempotent: naming a pool where it holds nothing
	// costs a call and gives back nothing.
	Pools []string
	// Place is its place in a pool's fair order, reserved at the door and
	// not taken by a queue entry (Tag 0: none).
	Place request.Place
	// Rate is its rate-limit reservation (limiter.Decision.Reservation;
	// "": none).
	Rate string
	// Budget is its monthly budget charge (budget.Decision.Reservation;
	// "": none).
	Budget string
	// Key is the Idempotency-Key it claimed, given back so that the
	// client's retry starts anew (nil: none, or kept as the request's).
	Key *idempotency.Key
}

// Used is what the request consumed: it settles what each holding
// charged. The zero value settles a request that consumed nothing.
type Used struct {
	// Rate is what it consumed against its rate reservation, which gives
	// back the rest; nil when unknown, and then nothing is given back.
	Rate *RateUse
	// QueueCost is what its permit's release settles its tenant's fair
	// order charge with (admission.Gate.ReleaseUsed; 0: nothing).
	QueueCost float64
	// PromptTokens and CompletionTokens settle its budget charge, priced
	// at Model in Pool, where it was answered (budget.Use).
	PromptTokens, CompletionTokens int64
	Pool, Model                    string
}

// RateUse is what a request consumed against its rate reservation.
type RateUse struct {
	Tokens, Requests int
}

// Returner gives holdings back. A nil Limiter, Budgets or Keys gives
// back nothing of that kind (the feature is off).
type Returner struct {
	Gate *admission.Gate
	// Notifier wakes whoever a released permit admits.
	Notifier admission.Notifier
	Limiter  *limiter.Limiter
	Budgets  *budget.Counter
	Keys     *idempotency.Store
	// Metrics counts budget overruns (nil: not counted).
	Metrics *metrics.Metrics
	Logger  *slog.Logger
}

// GiveBack gives back everything h holds, settled by u: each pool's permit
// or queue entry (waking whoever that admits), the place, the rate
// reservation, the budget charge and the key, in that order. Every step
// is tried; it returns what is still held, to give back again later, and
// the errors of the steps that failed. The steps are idempotent but the
// place's: a place is given back once, and one whose give-back failed is
// logged and left to lapse (its tenant is charged for it until then), as
// a retry could give it back twice. A waiter that could not be woken is
// logged, not an error: it re-checks on its own.
func (r *Returner) GiveBack(ctx context.Context, h Holdings, u Used) (Holdings, error) {
	var errs []error
	var held []string
	for _, pool := range h.Pools {
		_, err := r.Gate.ReleaseUsedAndWake(ctx, r.Notifier, pool, h.RequestID, u.QueueCost)
		if errors.Is(err, admission.ErrNotWoken) {
			r.logger().Warn("wake granted waiters", "requestID", h.RequestID, "pool", pool, "err", err)
			err = nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("release the permit or queue entry in %s: %w", pool, err))
			held = append(held, pool)
		}
	}
	h.Pools = nil
	rest, err := r.GiveBackCharges(ctx, h, u)
	rest.Pools = held
	return rest, errors.Join(append(errs, err)...)
}

// GiveBackCharges is GiveBack of what a request is charged on its way in,
// before it holds a permit or a queue entry: the place, the rate
// reservation, the budget charge and the key (h.Pools must be empty: the
// door's requests that never started hold no more).
func (r *Returner) GiveBackCharges(ctx context.Context, h Holdings, u Used) (Holdings, error) {
	rest := Holdings{RequestID: h.RequestID}
	var errs []error
	failed := func(err error) bool {
		if err != nil {
			errs = append(errs, err)
		}
		return err != nil
	}
	if h.Place.Tag != 0 {
		if err := r.Gate.Unreserve(ctx, h.Place); err != nil {
			r.logger().Warn("give back a place in the fair order; it lapses", "requestID", h.RequestID, "err", err)
		}
	}
	if h.Rate != "" && u.Rate != nil && r.Limiter != nil {
		_, err := r.Limiter.Refund(ctx, h.Rate, float64(u.Rate.Tokens), float64(u.Rate.Requests))
		if failed(wrap(err, "refund the rate limits")) {
			rest.Rate = h.Rate
		}
	}
	if h.Budget != "" && r.Budgets != nil {
		s, err := r.Budgets.Settle(ctx, h.Budget, budget.Use{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
			Pool: u.Pool, Model: u.Model})
		if failed(wrap(err, "settle the budget charge")) {
			rest.Budget = h.Budget
		}
		r.overran(ctx, h.RequestID, u, s)
	}
	if h.Key != nil && r.Keys != nil {
		if failed(wrap(r.Keys.Release(ctx, *h.Key, h.RequestID), "release the idempotency key")) {
			rest.Key = h.Key
		}
	}
	return rest, errors.Join(errs...)
}

// overran reports a request that used more than its budget reservation:
// the excess is charged (the month counts what the ledger records), so a
// month passes its limit only by such excesses, each counted and logged
// here with the tenant it is charged to.
func (r *Returner) overran(ctx context.Context, requestID string, u Used, s budget.Settlement) {
	if s.OverTokens <= 0 && s.OverMicros <= 0 {
		return
	}
	r.Metrics.BudgetOverrun(u.Pool, s.OverTokens, s.OverMicros)
	r.logger().LogAttrs(ctx, slog.LevelWarn, "request used more than its budget reservation; the excess is charged",
		slog.String("requestID", requestID), slog.String("tenant", s.Tenant), slog.String("pool", u.Pool), slog.String("model", u.Model),
		slog.Int64("over_tokens", s.OverTokens), slog.Float64("over_usd", budget.USD(s.OverMicros)))
}

// Empty reports whether h holds nothing.
func (h Holdings) Empty() bool {
	return len(h.Pools) == 0 && h.Place.Tag == 0 && h.Rate == "" && h.Budget == "" && h.Key == nil
}

func wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (r *Returner) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}
