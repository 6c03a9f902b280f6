package workflows

import (
	"time"

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
// then a regular activity retried for responsePatience (afterEnd). The activity
// reads the answer from the event log: the text never passes through
// Temporal.
func (w *chat) storeResponse(ctx workflow.Context) {
	if len(w.in.Response) == 0 {
		return
	}
	in := activities.StoreResponseInput{RequestID: w.in.RequestID, Tenant: w.in.Tenant, Params: w.in.Response}
	if err := w.afterEnd(ctx, a.StoreResponse, in, responsePatience, "the response store refused the answer"); err != nil {
		w.logger.Error("response not stored: the store refused it for a day", "error", err)
	}
}
