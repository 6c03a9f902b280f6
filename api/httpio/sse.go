package httpio

import (
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// StartSSE sends the headers of an event stream and returns the writer of
// its events; an error means the client is gone.
func StartSSE(w *echo.Response, id string, timeout time.Duration) (SSEWriter, error) {
	h := w.Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set(echo.HeaderCacheControl, "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	h.Set("X-Request-ID", id)
	out := SSEWriter{w: w, rc: http.NewResponseController(w.Writer), timeout: timeout}
	out.Arm()
	w.WriteHeader(http.StatusOK)
	return out, out.Flush()
}

// SSEWriter writes an event stream to one client. Every write and flush
// first moves the connection's write deadline timeout ahead: a client that
// stops reading fills the socket's buffers, and the write that then blocks
// fails within timeout instead of holding the handler (and the request's
// subscription) for as long as the client likes. The server clears the
// deadline once the response is finished, before the connection's next
// request.
type SSEWriter struct {
	w *echo.Response
	// rc reaches the connection under echo's writer; its Flush, unlike
	// echo's, reports a failed write.
	rc      *http.ResponseController
	timeout time.Duration
}

// Arm sets the write deadline for what is written next. A writer without
// deadlines (a test's recorder) simply has none.
func (o SSEWriter) Arm() { _ = o.rc.SetWriteDeadline(time.Now().Add(o.timeout)) }

// Printf writes to the stream.
func (o SSEWriter) Printf(format string, args ...any) error {
	o.Arm()
	_, err := fmt.Fprintf(o.w, format, args...)
	return err
}

// Flush sends what was written; an error means the client is gone.
func (o SSEWriter) Flush() error {
	o.Arm()
	return o.rc.Flush()
}
