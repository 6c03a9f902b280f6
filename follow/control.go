package follow

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/workflows"
)

// ErrAlreadySent: a resume asked for the events after the request's
// terminal event; the client has them all.
var ErrAlreadySent = errors.New("the client already has the request's terminal event")

// ErrStreamGone: the request has no events any more (they expired, or
// Redis lost them).
var ErrStreamGone = errors.New("the request's events are gone")

// Resume follows a request's events after event id after ("0-0" for all)
// and tells its workflow that a reader is back, in case its first client
// left.
func (f *Follower) Resume(ctx context.Context, id, after string) (*events.Subscription, error) {
	end, ended, err := f.events.End(ctx, id)
	if err != nil {
		return nil, refusal.Unreachable("event store unavailable")
	}
	if ended && events.CompareIDs(after, end.ID) >= 0 {
		return nil, ErrAlreadySent
	}
	sub, err := f.hub.Subscribe(ctx, id, after)
	if err != nil {
		return nil, refusal.Unreachable("event stream unavailable")
	}
	f.signalAttach(ctx, id)
	return sub, nil
}

// Attach follows a request that exists, from its first event (or after
// the event id after), as a resume does, for a client that sent the POST
// that started it again: nothing is charged and nothing starts. The
// workflow hears that a reader is back, in case the first client left.
// A request whose events are gone is ErrStreamGone.
func (f *Follower) Attach(ctx context.Context, id, after string) (*events.Subscription, error) {
	sub, err := f.Watch(ctx, id, after)
	if err != nil {
		return nil, err
	}
	f.signalAttach(ctx, id)
	return sub, nil
}

// Watch follows a request that exists, from its first event (or after the
// event id after), without telling its workflow: for a background
// request, which runs to its end whoever reads it, a reader coming or
// going is not worth a signal. A request whose events are gone is
// ErrStreamGone.
func (f *Follower) Watch(ctx context.Context, id, after string) (*events.Subscription, error) {
	if after == "" || !events.ValidID(after) {
		after = "0"
	}
	exists, err := f.events.Exists(ctx, id)
	switch {
	case err != nil:
		return nil, refusal.Unreachable("event store unavailable")
	case !exists:
		return nil, ErrStreamGone
	}
	sub, err := f.hub.Subscribe(ctx, id, after)
	if err != nil {
		return nil, refusal.Unreachable("event stream unavailable")
	}
	return sub, nil
}

// signalAttach tells a request's workflow that a reader is back; a
// request that has no workflow (any more, or yet) needs no telling.
func (f *Follower) signalAttach(ctx context.Context, id string) {
	err := f.temporal.SignalWorkflow(context.WithoutCancel(ctx), workflows.ChatWorkflowID(id), "", workflows.SignalAttach, workflows.AttachSignal{})
	if err != nil && !conn.NotFound(err) {
		f.logger.Warn("signal attach", "requestID", id, "err", err)
	}
}

// Detach tells the workflow that a reader left. It must outlive the
// request's context, which is already cancelled.
func (f *Follower) Detach(id string) {
	if f.Draining() {
		// The process is going away, not the client: it will resume
		// against another instance.
		return
	}
	f.DetachNow(id)
}

// DetachNow tells the workflow that a reader left, even while the
// process drains: for a client that cannot resume (an OpenAI client), the
// request should end rather than run for nobody.
func (f *Follower) DetachNow(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := f.temporal.SignalWorkflow(ctx, workflows.ChatWorkflowID(id), "", workflows.SignalDetach, workflows.AttachSignal{})
	if err != nil && !conn.NotFound(err) {
		f.logger.Warn("signal detach", "requestID", id, "err", err)
	}
}

// Cancel ends a request at the client's word: its workflow is signalled,
// or, when it has none yet, its stop flag is raised for the door it waits
// at (on any instance). A request that already finished is a Conflict.
func (f *Follower) Cancel(ctx context.Context, id string) error {
	err := f.temporal.SignalWorkflow(ctx, workflows.ChatWorkflowID(id), "", workflows.SignalCancel, workflows.CancelSignal{Reason: "client_request"})
	if err == nil {
		return nil
	}
	if !conn.NotFound(err) {
		return refusal.Unreachable("workflow service unavailable")
	}
	// No workflow: it finished, or it is still waiting at the door of
	// some API process for its workflow to start. That process reads the
	// stop flag while it waits.
	_, ended, err := f.events.End(ctx, id)
	if err == nil && !ended {
		// Its events may have expired meanwhile: then it is long over.
		var exists bool
		exists, err = f.events.Exists(ctx, id)
		ended = !exists
	}
	if err != nil {
		return refusal.Unreachable("event store unavailable")
	}
	if ended {
		return &refusal.Error{Class: refusal.Conflict, Code: "already_finished", Message: "the request has already finished"}
	}
	if err := f.events.Stop(ctx, id, f.opts.StopTTL); err != nil {
		return refusal.Unreachable("event store unavailable")
	}
	return nil
}
