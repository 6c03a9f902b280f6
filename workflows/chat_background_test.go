package workflows

import (
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// backgroundInput is a background request whose client would be given
// up at once if it were an attached one.
func backgroundInput() ChatInput {
	in := input()
	in.Background = true
	in.Settings.DisconnectGrace = 0
	return in
}

// A background request's readers come and go without ending it: a detach
// with no grace at all leaves it queued until its max wait, where an
// attached request would have been cancelled at once.
func (s *chatSuite) TestBackgroundOutlivesItsReaders() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(SignalAttach, AttachSignal{}) }, time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(SignalDetach, AttachSignal{}) }, 2*time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(SignalDetach, AttachSignal{}) }, 3*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, backgroundInput())
	r := s.result()
	s.Equal(request.OutcomeRejected, r.Outcome, "not cancelled by its readers leaving")
	s.Equal(request.ReasonQueueTimeout, r.Reason)
	s.Equal("short", s.onlyFinalize().Pool)
}

// The same input without Background is cancelled by the first detach:
// the test above fails for the right reason.
func (s *chatSuite) TestAttachedRequestWithNoGraceEndsAtDetach() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	in := backgroundInput()
	in.Background = false
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(SignalDetach, AttachSignal{}) }, 2*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	r := s.result()
	s.Equal(request.OutcomeCancelled, r.Outcome)
	s.Contains(s.onlyFinalize().Failure.Message, "client_disconnected")
}

// A cancel still ends a background request, stream and permit included.
func (s *chatSuite) TestBackgroundEndsAtCancel() {
	stopped := s.streamUntilStopped()
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(SignalDetach, AttachSignal{}) }, time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.env.SignalWorkflow(SignalCancel, CancelSignal{Reason: "client_request"})
	}, 3*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, backgroundInput())
	r := s.result()
	s.Equal(request.OutcomeCancelled, r.Outcome)
	f := s.onlyFinalize()
	s.Equal("short", f.Pool, "the permit is given back")
	s.Equal(events.TypeError, f.EventType)
	s.Contains(f.Failure.Message, "client_request")
	s.awaitStopFlag(stopped)
	s.True(f.StopStream)
}
