package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/labstack/echo/v4"
	"go.temporal.io/api/serviceerror"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

const keepAliveInterval = 15 * time.Second

// streamState follows a request through its events, so that the stream
// knows when to poll the queue position and when it is over.
type streamState struct {
	queued   bool
	pool     string
	position int
	terminal bool
	// started: the request's workflow wrote an event, so it exists.
	started bool
	// tokens is how many tokens were sent: the next one's index.
	tokens int
}

// repeated reports a token already sent: a write the activity retried
// while Redis stalled may have landed twice.
func (st *streamState) repeated(ev events.Event) bool {
	if ev.Type != events.TypeToken {
		return false
	}
	var tok struct {
		Index int `json:"index"`
	}
	if json.Unmarshal(ev.Data, &tok) != nil {
		return false
	}
	if tok.Index < st.tokens {
		return true
	}
	st.tokens = tok.Index + 1
	return false
}

func (st *streamState) observe(ev events.Event) {
	switch ev.Type {
	case events.TypeQueue:
		var q events.Queue
		if json.Unmarshal(ev.Data, &q) == nil {
			st.queued, st.pool, st.position = true, q.Pool, q.Position
		}
	case events.TypeToken:
		st.started = true
	case events.TypeStage:
		st.started = true
		var sg events.Stage
		if json.Unmarshal(ev.Data, &sg) == nil && sg.Stage != request.StageAdmission && sg.Stage != request.StageEmbed {
			st.queued = false
		}
	default:
		if events.Terminal(ev.Type) {
			st.queued = false
			st.terminal = true
		}
	}
}

// stream writes the request's events after afterID as SSE until its
// terminal event. If the client goes away first, the workflow is told it
// was detached; with no reader back within the grace period it cancels
// itself.
func (s *Server) stream(c echo.Context, sub *events.Subscription, id string) error {
	out, err := startSSE(c.Response(), id, s.cfg.API.StreamWriteTimeout)
	if err != nil {
		s.detach(id)
		return nil
	}
	// The server's own closing bytes follow the handler: bound them too.
	defer out.arm()
	switch s.follow(c.Request().Context(), sub, id, sseSink{out}, true) {
	case endClientGone, endInterrupted:
		// An interrupted client resumes with Last-Event-ID.
		s.detach(id)
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

// eventSink renders a request's events for one client.
type eventSink interface {
	// write renders one event; an error means the client is gone.
	write(ev events.Event) error
	// keepAlive is called when the stream has been quiet for a while.
	keepAlive() error
	// flush sends what was written; an error means the client is gone.
	flush() error
}

// sseSink writes events as they are: Sluice's own SSE.
type sseSink struct{ out sseWriter }

func (k sseSink) write(ev events.Event) error {
	return k.out.printf("id: %s\nevent: %s\ndata: %s\n\n", ev.ID, ev.Type, ev.Data)
}

func (k sseSink) keepAlive() error { return k.out.printf(": keep-alive\n\n") }

func (k sseSink) flush() error { return k.out.flush() }

// followEnd is why follow returned.
type followEnd int

const (
	// endTerminal: the request's terminal event was written.
	endTerminal followEnd = iota
	// endClientGone: the client left, or writing to it failed.
	endClientGone
	// endInterrupted: the hub stopped (shutdown) or this reader fell
	// behind; the request goes on without this reader.
	endInterrupted
)

// follow feeds the request's events to out until its terminal event or
// until the reader can go no further. With positions set it also reports
// the request's queue position while it waits. The caller decides what a
// reader that did not reach the end means for the request.
func (s *Server) follow(ctx context.Context, sub *events.Subscription, id string, out eventSink, positions bool) followEnd {
	st := &streamState{}
	defer s.live.follow(id)()
	poll := time.NewTicker(s.cfg.API.QueuePollInterval)
	defer poll.Stop()
	keepAlive := time.NewTicker(keepAliveInterval)
	defer keepAlive.Stop()
	idle := time.NewTimer(s.cfg.API.StreamIdleTimeout)
	defer idle.Stop()

	for {
		select {
		case <-ctx.Done():
			return endClientGone
		case <-sub.Notify():
			evs, err := sub.Drain()
			if err != nil {
				return endInterrupted
			}
			if len(evs) == 0 {
				continue
			}
			for _, ev := range evs {
				if st.repeated(ev) {
					continue
				}
				if err := out.write(ev); err != nil {
					return endClientGone
				}
				st.observe(ev)
			}
			if st.started {
				s.live.started(id)
			}
			if err := out.flush(); err != nil {
				return endClientGone
			}
			if st.terminal {
				return endTerminal
			}
			idle.Reset(s.cfg.API.StreamIdleTimeout)
		case <-poll.C:
			if positions && st.queued {
				s.reportPosition(ctx, id, st)
			}
		case <-keepAlive.C:
			if err := out.keepAlive(); err != nil {
				return endClientGone
			}
			if err := out.flush(); err != nil {
				return endClientGone
			}
		case <-idle.C:
			s.endIfGone(ctx, id, st.started)
			idle.Reset(s.cfg.API.StreamIdleTimeout)
		}
	}
}

// reportPosition writes a queue event when the request's place changed.
// Positions are read here, outside the workflow, because workflow timers
// are too coarse for sub-second updates.
func (s *Server) reportPosition(ctx context.Context, id string, st *streamState) {
	pos, ok, err := s.gate.Position(ctx, st.pool, id)
	if err != nil || !ok || pos == st.position {
		return
	}
	stats, err := s.gate.Stats(ctx, st.pool)
	if err != nil {
		return
	}
	q := events.Queue{Position: pos, EstimatedWaitMs: admission.EstimateWait(pos, stats.Limit, stats.MeanHold).Milliseconds(), Pool: st.pool}
	if _, err := s.events.Append(ctx, id, events.TypeQueue, q); err != nil {
		s.logger.Warn("write queue event", "requestID", id, "err", err)
		return
	}
	// Remember it now so that a slow hub does not make us write it twice.
	st.position = pos
}

// endIfGone checks a stream that has been quiet for
// api.stream_idle_timeout: a request whose workflow is gone gets its error
// event, which ends every reader. The liveness rounds check only requests
// seen started; this also covers a reader that joined past the events
// that showed it (a resume), by looking for them in the log.
func (s *Server) endIfGone(ctx context.Context, id string, started bool) {
	if !started && !s.hasStage(ctx, id) {
		// Still at a door, which ends it itself.
		return
	}
	s.live.started(id)
	if gone, status := s.live.describe(ctx, id); gone {
		s.live.end(ctx, id, status)
	}
}

// hasStage reports whether the request's log shows a stage, which only
// its workflow writes.
func (s *Server) hasStage(ctx context.Context, id string) bool {
	evs, err := s.events.After(ctx, id, "0", 64)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(evs, func(ev events.Event) bool { return ev.Type == events.TypeStage })
}

// detach tells the workflow that a reader left. It must outlive the
// request's context, which is already cancelled.
func (s *Server) detach(id string) {
	if s.draining.Load() {
		// The process is going away, not the client: it will resume
		// against another instance.
		return
	}
	s.signalDetach(id)
}

// signalDetach tells the workflow that a reader left, even while the
// process drains: for a client that cannot resume (an OpenAI client), the
// request should end rather than run for nobody.
func (s *Server) signalDetach(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.temporal.SignalWorkflow(ctx, workflows.ChatWorkflowID(id), "", workflows.SignalDetach, workflows.AttachSignal{})
	if err != nil && !isNotFound(err) {
		s.logger.Warn("signal detach", "requestID", id, "err", err)
	}
}

func isNotFound(err error) bool {
	var nf *serviceerror.NotFound
	return errors.As(err, &nf)
}
