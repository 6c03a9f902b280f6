package activities

import (
	"cmp"
	"context"

	"go.temporal.io/sdk/activity"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
)

// Finalize ends a request: it logs and counts it once, stops its stream,
// gives back what it holds (its permit or queue place, waking whoever that
// admits, and the rest of its rate-limit and budget charges), records its
// turn in its session, reports it, and writes its terminal event. Each
// step is idempotent: it is retried until it succeeds.
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
	if _, err := a.Returner.GiveBack(ctx, in.holdings(a.Gate.Pools()), in.used(a.Options.OutputTokenWeight)); err != nil {
		return err
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

// holdings is what the finalized request holds: a permit or queue entry
// in the pool admission used, or in any of all when admission began but
// its answer never came back; its rate reservation; its budget charge.
func (in FinalizeInput) holdings(all []string) holdings.Holdings {
	h := holdings.Holdings{RequestID: in.RequestID, Rate: in.Reservation}
	switch {
	case in.AllPools:
		h.Pools = all
	case in.Pool != "":
		h.Pools = []string{in.Pool}
	}
	if in.Budget != nil {
		h.Budget = in.Budget.Reservation
	}
	return h
}

// used is what the finalized request consumed. Its tokens settle what
// admission charged its tenant (only the release that gives the permit
// back settles); Used holds the total alone, so with output tokens
// weighted (outputWeight not 1) the split is unknown here and the charge
// stays (the stream's own release settles). Nothing of the rate
// reservation is given back when Used is unknown.
func (in FinalizeInput) used(outputWeight float64) holdings.Used {
	var u holdings.Used
	if in.Used != nil {
		u.Rate = &holdings.RateUse{Tokens: in.Used.Tokens, Requests: in.Used.Requests}
		if outputWeight == 1 || outputWeight == 0 {
			u.QueueCost = admission.TokenCost(in.Used.Tokens)
		}
	}
	if b := in.Budget; b != nil {
		u.PromptTokens, u.CompletionTokens = int64(b.PromptTokens), int64(b.CompletionTokens)
		u.Pool, u.Model = b.Pool, b.Model
	}
	return u
}
