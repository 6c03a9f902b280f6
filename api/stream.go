package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/events"
)

// stream writes the request's events after afterID as SSE until its
// terminal event. If the client goes away first, the workflow is told it
// was detached; with no reader back within the grace period it cancels
// itself.
func (s *Server) stream(c echo.Context, sub *events.Subscription, id string) error {
	out, err := startSSE(c.Response(), id, s.cfg.API.StreamWriteTimeout)
	if err != nil {
		s.door.Detach(id)
		return nil
	}
	// The server's own closing bytes follow the handler: bound them too.
	defer out.arm()
	switch s.door.Follow(c.Request().Context(), sub, id, sseSink{out}, true) {
	case door.EndClientGone, door.EndInterrupted:
		// An interrupted client resumes with Last-Event-ID.
		s.door.Detach(id)
	}
	return nil
}

// startSSE sends the headers of an event stream and returns the writer of
// its events; an error means the client is gone.
func startSSE(w *echo.Response, id string, timeout time.Duration) (sseWriter, error) {
	h := w.Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set(echo.HeaderCacheControl, "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	h.Set("X-Request-ID", id)
	out := sseWriter{w: w, rc: http.NewResponseController(w.Writer), timeout: timeout}
	out.arm()
	w.WriteHeader(http.StatusOK)
	return out, out.flush()
}

// sseWriter writes an event stream to one client. Every write and flush
// first moves the connection's write deadline timeout ahead: a client that
// stops reading fills the socket's buffers, and the write that then blocks
// fails within timeout instead of holding the handler (and the request's
// subscription) for as long as the client likes. The server clears the
// deadline once the response is finished, before the connection's next
// request.
type sseWriter struct {
	w *echo.Response
	// rc reaches the connection under echo's writer; its Flush, unlike
	// echo's, reports a failed write.
	rc      *http.ResponseController
	timeout time.Duration
}

// arm sets the write deadline for what is written next. A writer without
// deadlines (a test's recorder) simply has none.
func (o sseWriter) arm() { _ = o.rc.SetWriteDeadline(time.Now().Add(o.timeout)) }

func (o sseWriter) printf(format string, args ...any) error {
	o.arm()
	_, err := fmt.Fprintf(o.w, format, args...)
	return err
}

func (o sseWriter) flush() error {
	o.arm()
	return o.rc.Flush()
}

// sseSink writes events as they are: Sluice's own SSE.
type sseSink struct{ out sseWriter }

func (k sseSink) Write(ev events.Event) error {
	return k.out.printf("id: %s\nevent: %s\ndata: %s\n\n", ev.ID, ev.Type, ev.Data)
}

func (k sseSink) KeepAlive() error { return k.out.printf(": keep-alive\n\n") }

func (k sseSink) Flush() error { return k.out.flush() }
