package api

import (
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/pkg/events"
)

// stream writes the request's events after afterID as SSE until its
// terminal event. If the client goes away first, the workflow is told it
// was detached; with no reader back within the grace period it cancels
// itself.
func (s *Server) stream(c echo.Context, sub *events.Subscription, id string) error {
	out, err := httpio.StartSSE(c.Response(), id, s.cfg.API.StreamWriteTimeout)
	if err != nil {
		s.follow.Detach(id)
		return nil
	}
	// The server's own closing bytes follow the handler: bound them too.
	defer out.Arm()
	switch s.follow.Follow(c.Request().Context(), sub, id, sseSink{out}, true) {
	case follow.EndClientGone, follow.EndInterrupted:
		// An interrupted client resumes with Last-Event-ID.
		s.follow.Detach(id)
	}
	return nil
}

// sseSink writes events as they are: Sluice's own SSE.
type sseSink struct{ out httpio.SSEWriter }

func (k sseSink) Write(ev events.Event) error {
	return k.out.Printf("id: %s\nevent: %s\ndata: %s\n\n", ev.ID, ev.Type, ev.Data)
}

func (k sseSink) KeepAlive() error { return k.out.Printf(": keep-alive\n\n") }

func (k sseSink) Flush() error { return k.out.Flush() }
