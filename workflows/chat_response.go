package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
)

// responsePatience is how long a stored response the store refuses is
// retried before it is given up and logged.
const responsePatience = 24 * time.Hour

// storeResponse stores the finished request's answer when it is a stored
// response of the Responses API (ChatInput.Response): after finalize, so
// that the client and the next waiter never wait for the store, and
// before the usage ledger, so that a client that continues the response
// (previous_response_id) at once finds it soon. A local attempt first,
// then a regular activity retried for responsePatience. The activity
// reads the answer from the event log: the text never passes through
// Temporal.
func (w *chat) storeResponse(ctx workflow.Context) {
	if len(w.in.Response) == 0 {
		return
	}
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	in := activities.StoreResponseInput{RequestID: w.in.RequestID, Tenant: w.in.Tenant, Params: w.in.Response}
	lctx := workflow.WithLocalActivityOptions(dctx, workflow.LocalActivityOptions{
		StartToCloseTimeout:    5 * time.Second,
		ScheduleToCloseTimeout: 30 * time.Second,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaximumInterval: 5 * time.Second},
	})
	err := workflow.ExecuteLocalActivity(lctx, a.StoreResponse, in).Get(lctx, nil)
	if err == nil {
		return
	}
	w.logger.Warn("the response store refused the answer; retrying it in the background", "error", err, "for", responsePatience)
	actx := workflow.WithActivityOptions(dctx, workflow.ActivityOptions{
		StartToCloseTimeout:    30 * time.Second,
		ScheduleToCloseTimeout: responsePatience,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 5 * time.Minute},
	})
	if err := workflow.ExecuteActivity(actx, a.StoreResponse, in).Get(actx, nil); err != nil {
		w.logger.Error("response not stored: the store refused it for a day", "error", err)
	}
}
