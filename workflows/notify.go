package workflows

import (
	"context"
	"errors"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/request"
)

// SignalNotifier tells queued chat workflows what happened to their place,
// by signal: the client side of SignalAdmitted and SignalCancel, for the
// worker's janitor and activities and for the API.
type SignalNotifier struct {
	Client client.Client
}

// NotifyGranted implements admission.Notifier: the workflow gets the
// admitted signal; a workflow already gone is admission.ErrWaiterGone.
func (n SignalNotifier) NotifyGranted(ctx context.Context, pool, requestID string) error {
	err := n.Client.SignalWorkflow(ctx, ChatWorkflowID(requestID), "", SignalAdmitted, AdmittedSignal{Pool: pool})
	if isNotFound(err) {
		return admission.ErrWaiterGone
	}
	return err
}

// NotifyShed implements activities.ShedNotifier: the request's workflow
// gets the cancel signal with reason shed and ends it with a rejected
// event. A workflow already gone is not an error.
func (n SignalNotifier) NotifyShed(ctx context.Context, _, requestID string) error {
	err := n.Client.SignalWorkflow(ctx, ChatWorkflowID(requestID), "", SignalCancel,
		CancelSignal{Reason: request.ReasonShed})
	if isNotFound(err) {
		return nil
	}
	return err
}

func isNotFound(err error) bool {
	var nf *serviceerror.NotFound
	return errors.As(err, &nf)
}
