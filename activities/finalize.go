package activities

import (
	"cmp"
	"context"
	"errors"

	"go.temporal.io/sdk/activity"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
)

// Finalize gives back the request's permit or queue place (idempotently:
// it is retried), wakes whoever that admitted, and writes the terminal event.
func (a *Chat) Finalize(ctx context.Context, in FinalizeInput) error {
	if in.Report != nil && activity.GetInfo(ctx).Attempt == 1 {
		// The request's one log line and its tenant's service, before
		// anything here can fail: a retried Finalize would count them
		// again, and one failing on Redis would never count them.
		a.logFinished(ctx, in.RequestID, *in.Report)
		a.countService(*in.Report)
	}
	if in.StopStream {
		if err := a.StopStream(ctx, StopStreamInput{RequestID: in.RequestID}); err != nil {
			return err
		}
	}
	var pools []string
	switch {
	case in.AllPools:
		pools = a.Gate.Pools()
	case in.Pool != "":
		pools = []string{in.Pool}
	}
	// What the request used settles what admission charged its tenant
	// (only the release that gives the permit back settles). Used holds
	// the total alone: with output tokens weighted, the split is unknown
	// here and the charge stays (the stream's own release settles).
	var used float64
	if in.Used != nil && (a.Options.OutputTokenWeight == 1 || a.Options.OutputTokenWeight == 0) {
		used = admission.TokenCost(in.Used.Tokens)
	}
	for _, pool := range pools {
		_, err := a.Gate.ReleaseUsedAndWake(ctx, a.Notifier, pool, in.RequestID, used)
		if errors.Is(err, admission.ErrNotWoken) {
			a.logger(in.RequestID).Warn("wake granted waiters", "err", err)
		} else if err != nil {
			return err
		}
	}
	if in.Used != nil && in.Reservation != "" && a.Limiter != nil {
		if _, err := a.Limiter.Refund(ctx, in.Reservation, float64(in.Used.Tokens), float64(in.Used.Requests)); err != nil {
			return err
		}
	}
	if in.Budget != nil && a.Budgets != nil {
		b := in.Budget
		if _, err := a.Budgets.Settle(ctx, b.Reservation, int64(b.PromptTokens), int64(b.CompletionTokens)); err != nil {
			return err
		}
	}
	if in.Turn != nil && a.Sessions != nil {
		if err := a.recordTurn(ctx, in); err != nil {
			return err
		}
	}
	if in.Report != nil && activity.GetInfo(ctx).Attempt == 1 {
		// Once per request: a retried Finalize would count it again.
		a.report(*in.Report)
	}
	if in.EventType == "" {
		return nil
	}
	var data any = in.Failure
	if in.EventType == events.TypeDone && in.Done != nil {
		data = doneEvent(ctx, *in.Done, *cmp.Or(in.Answer, &Answer{}))
	}
	if _, _, err := a.Events.AppendFinal(ctx, in.RequestID, in.EventType, data); err != nil {
		return err
	}
	return nil
}

// StopStream raises the stop flag that a running LLM stream checks with
// every token.
func (a *Chat) StopStream(ctx context.Context, in StopStreamInput) error {
	return a.Events.Stop(ctx, in.RequestID, a.Options.StopFlagTTL)
}
