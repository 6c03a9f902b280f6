package workflows

import (
	"cmp"
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// usageLedgerChange is the change that made a request record its usage
// when it ends.
const usageLedgerChange = "usage-ledger"

// usagePatience is how long a record the ledger refuses is retried (in
// the server's hands, as a regular activity) before it is given up and
// logged: a ledger outage of up to a day loses nothing.
const usagePatience = 24 * time.Hour

// recordUsage writes the finished request to the usage ledger, once: the
// record is keyed by the request id, so the retry after a worker died
// between writing it and reporting it adds nothing. It runs after
// finalize, when the terminal event is written and the permit given
// back, so that neither the client nor the next waiter waits for the
// ledger, and a ledger outage never fails an answer: a local attempt
// first (one database write, no server round trip), then a regular
// activity retried for usagePatience, while the workflow stays open.
func (w *chat) recordUsage(ctx workflow.Context) {
	// The version first, whether the ledger is on or not: every request
	// reaches the branch, so recorded histories of requests that ran
	// before it replay through its old side.
	if workflow.GetVersion(ctx, usageLedgerChange, workflow.DefaultVersion, 1) == workflow.DefaultVersion || !w.in.Settings.RecordUsage {
		return
	}
	in := activities.RecordUsageInput{Entry: w.usageEntry(ctx)}
	if err := w.afterEnd(ctx, a.RecordUsage, in, usagePatience, "usage ledger refused the record"); err != nil {
		// sluice_usage_records_total{result="failed"} counted every attempt.
		w.logger.Error("usage not recorded: the ledger refused it for a day", "error", err)
	}
}

// afterEnd runs activity, which keeps what a finished request leaves
// (its usage record, its stored response), once: a local attempt first
// (one write, no server round trip), then, when that is refused (said
// as refused), a regular activity retried for patience while the
// workflow stays open. It runs on a disconnected context, so that a
// cancelled request still keeps it. It returns the last attempt's error.
func (w *chat) afterEnd(ctx workflow.Context, activity, in any, patience time.Duration, refused string) error {
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	lctx := workflow.WithLocalActivityOptions(dctx, workflow.LocalActivityOptions{
		StartToCloseTimeout:    5 * time.Second,
		ScheduleToCloseTimeout: 30 * time.Second,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaximumInterval: 5 * time.Second},
	})
	err := workflow.ExecuteLocalActivity(lctx, activity, in).Get(lctx, nil)
	if err == nil {
		return nil
	}
	w.logger.Warn(refused+"; retrying it in the background", "error", err, "for", patience)
	actx := workflow.WithActivityOptions(dctx, workflow.ActivityOptions{
		StartToCloseTimeout:    30 * time.Second,
		ScheduleToCloseTimeout: patience,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 5 * time.Minute,
		},
	})
	return workflow.ExecuteActivity(actx, activity, in).Get(actx, nil)
}

// usageEntry is the finished request as the ledger keeps it.
func (w *chat) usageEntry(ctx workflow.Context) usage.Entry {
	return usage.Entry{
		RequestID: w.in.RequestID, Tenant: w.in.Tenant, User: w.in.User, KeyID: w.in.KeyID,
		Model: w.answeredBy(), Pool: w.pool, Route: w.result.Route,
		PromptTokens: w.billed.PromptTokens, CompletionTokens: w.billed.CompletionTokens, CachedTokens: w.cachedTokens,
		Outcome: w.result.Outcome, Reason: w.result.Reason, ServiceTier: w.in.ServiceTier,
		FinishedAt: workflow.Now(ctx).UTC(),
	}
}

// answeredBy is the model that answered: the one the backend named, else
// the one the stream asked for (a fallback's; "": the pool's own, which
// RecordUsage names).
func (w *chat) answeredBy() string {
	return cmp.Or(w.model, w.llmModel)
}

// partialUsage is what a failed or cancelled stream reported it had
// consumed (its error's details); zero when it does not say.
func partialUsage(err error) events.Usage {
	var u events.Usage
	var canceled *temporal.CanceledError
	if errors.As(err, &canceled) {
		if canceled.HasDetails() && canceled.Details(&u) == nil {
			return u
		}
		return events.Usage{}
	}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) && appErr.HasDetails() && appErr.Type() != activities.ErrTypeBackendUnavailable {
		if appErr.Details(&u) == nil {
			return u
		}
	}
	return events.Usage{}
}
