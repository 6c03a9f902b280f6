package door

import (
	"context"
	"errors"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/workflows"
)

// ErrAlreadySent: a resume asked for the events after the request's
// terminal event; the client has them all.
var ErrAlreadySent = errors.New("the client already has the request's terminal event")

// Resume follows a request's events after event id after ("0-0" for all)
// and tells its workflow that a reader is back, in case its first client
// left.
func (d *Door) Resume(ctx context.Context, id, after string) (*events.Subscription, error) {
	last, ok, err := d.events.Last(ctx, id)
	if err != nil {
		return nil, refusal.Unreachable("event store unavailable")
	}
	if ok && events.Terminal(last.Type) && events.CompareIDs(after, last.ID) >= 0 {
		return nil, ErrAlreadySent
	}
	sub, err := d.hub.Subscribe(ctx, id, after)
	if err != nil {
		return nil, refusal.Unreachable("event stream unavailable")
	}
	d.signalAttach(ctx, id)
	return sub, nil
}

// signalAttach tells a request's workflow that a reader is back; a
// request that has no workflow (any more, or yet) needs no telling.
func (d *Door) signalAttach(ctx context.Context, id string) {
	err := d.temporal.SignalWorkflow(context.WithoutCancel(ctx), workflows.ChatWorkflowID(id), "", workflows.SignalAttach, workflows.AttachSignal{})
	if err != nil && !isNotFound(err) {
		d.logger.Warn("signal attach", "requestID", id, "err", err)
	}
}

// Cancel ends a request at the client's word: its workflow is signalled,
// or, when it has none yet, its stop flag is raised for the door it waits
// at (on any instance). A request that already finished is 409.
func (d *Door) Cancel(ctx context.Context, id string) error {
	err := d.temporal.SignalWorkflow(ctx, workflows.ChatWorkflowID(id), "", workflows.SignalCancel, workflows.CancelSignal{Reason: "client_request"})
	if err == nil {
		return nil
	}
	if !isNotFound(err) {
		return refusal.Unreachable("workflow service unavailable")
	}
	// No workflow: it finished, or it is still waiting at the door of
	// some API process for its workflow to start. That process reads the
	// stop flag while it waits.
	last, ok, err := d.events.Last(ctx, id)
	if err != nil {
		return refusal.Unreachable("event store unavailable")
	}
	if !ok || events.Terminal(last.Type) {
		return &refusal.Error{Class: refusal.Conflict, Code: "already_finished", Message: "the request has already finished"}
	}
	if err := d.events.Stop(ctx, id, d.cfg.Events.TTL); err != nil {
		return refusal.Unreachable("event store unavailable")
	}
	return nil
}
