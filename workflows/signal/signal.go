// Package signal is the client side of the chat workflow's signals: it
// tells queued requests that they were granted a permit or shed. It lives
// apart from package workflows, which holds only what runs inside a
// workflow.
package signal

import (
	"context"

	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// Notifier tells queued chat workflows what happened to their place,
// by signal: the client side of workflows.SignalAdmitted and workflows.SignalCancel, for the
// worker's janitor and activities and for the API.
type Notifier struct {
	Client client.Client
}

// NotifyGranted implements admission.Notifier: the workflow gets the
// admitted signal; a workflow that is not found is gone.
func (n Notifier) NotifyGranted(ctx context.Context, pool, requestID string) (gone bool, err error) {
	err = n.Client.SignalWorkflow(ctx, workflows.ChatWorkflowID(requestID), "", workflows.SignalAdmitted, workflows.AdmittedSignal{Pool: pool})
	if conn.NotFound(err) {
		return true, nil
	}
	return false, err
}

// NotifyShed implements activities.ShedNotifier: the request's workflow
// gets the cancel signal with reason shed and ends it with a rejected
// event. A workflow already gone is not an error.
func (n Notifier) NotifyShed(ctx context.Context, _, requestID string) error {
	err := n.Client.SignalWorkflow(ctx, workflows.ChatWorkflowID(requestID), "", workflows.SignalCancel,
		workflows.CancelSignal{Reason: request.ReasonShed})
	if conn.NotFound(err) {
		return nil
	}
	return err
}
