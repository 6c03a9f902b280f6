package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/pkg/answer"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/responses"
)

// Background responses and streams read again. A background response's
// request runs to its end with no client (its workflow ignores readers
// leaving), and any API replica can tell its events again, numbered as
// the first time, since the numbers are derived from its event log alone
// (answer.ResponseEncoder).

// maxGetBody bounds the body a GET of a response may carry.
const maxGetBody = 1024

// streamQuery reads GET /v1/responses/{id}'s ?stream= and
// ?starting_after=: whether to stream, and the first sequence number to
// send. The official Go client asks for the stream in a JSON body
// ({"stream": true}) instead of the query, which is read too.
func streamQuery(c echo.Context) (bool, int, error) {
	var stream bool
	switch v := c.QueryParam("stream"); v {
	case "false":
	case "":
		// It sends no Content-Type with it: the body is read as JSON
		// whatever it says, and only for this one field.
		body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxGetBody+1))
		switch {
		case err != nil:
			return false, 0, refusal.BadRequest("bad_body", "read request body: %v", err)
		case len(body) > maxGetBody:
			return false, 0, &refusal.Error{Class: refusal.TooLarge, Code: "body_too_large",
				Message: fmt.Sprintf("a GET's body exceeds %d bytes", maxGetBody)}
		case len(bytes.TrimSpace(body)) == 0:
			break
		default:
			var asked struct {
				Stream bool `json:"stream"`
			}
			if err := json.Unmarshal(body, &asked); err != nil {
				return false, 0, refusal.BadRequest("bad_json", "malformed JSON: %v", err)
			}
			stream = asked.Stream
		}
	case "true":
		stream = true
	default:
		return false, 0, paramError("stream", "invalid_value", "stream must be true or false, got %q", v)
	}
	v := c.QueryParam("starting_after")
	if v == "" {
		return stream, 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return false, 0, paramError("starting_after", "invalid_value", "starting_after must be a sequence number (an integer >= 0), got %q", v)
	}
	return stream, n + 1, nil
}

// streamAgain tells rec's events again from sequence number from, live
// while it runs: a client re-attaching to a background response, or one
// whose stream broke. The events come from the request's log, which is
// kept events.ttl after its end; past that the response is read whole.
func (s *Server) streamAgain(c echo.Context, rec responses.Record, from int) error {
	base, err := paramsOf(rec)
	if err != nil {
		return err
	}
	requestID, _ := answer.RequestID(rec.ID)
	ctx := c.Request().Context()
	// A background request runs whoever reads it, so its reader is not
	// worth a signal; any other learns that a reader is back.
	watch := s.follow.Attach
	if base.Background {
		watch = s.follow.Watch
	}
	sub, err := watch(ctx, requestID, "0")
	if errors.Is(err, follow.ErrStreamGone) {
		return paramError("stream", "stream_expired",
			"the events of response %s are no longer kept (events.ttl after its end): read it whole, without stream", rec.ID)
	}
	if err != nil {
		return err
	}
	defer sub.Close()
	enc := answer.NewResponseEncoder(requestID, base)
	return s.streamResponse(c, sub, requestID, base.Background, &responseSink{enc: enc, from: from})
}

// cancelWait bounds how long a cancel waits for the response to end, so
// that its answer says cancelled: the stream stops within a token, and
// the end is written at once.
const cancelWait = 2 * time.Second

// cancelResponse answers POST /v1/responses/{id}/cancel: a background
// response still running is stopped (its model call ends and its permit
// goes back) and answered as it stands then; one that ended is answered
// as it is. Only a background response can be cancelled, as at OpenAI:
// any other ends when its client leaves.
func (s *Server) cancelResponse(c echo.Context) error {
	_, rec, err := s.storedRecord(c, policy.RouteReads)
	if err != nil {
		return err
	}
	base, err := paramsOf(rec)
	if err != nil {
		return err
	}
	if !base.Background {
		return paramError("", "invalid_request", "only a response created with background: true can be cancelled; %s was not", rec.ID)
	}
	ctx := c.Request().Context()
	if err := s.stopRunning(ctx, rec); err != nil {
		return err
	}
	raw, ended, err := s.responseOf(ctx, rec)
	for deadline := time.Now().Add(cancelWait); err == nil && !ended && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
		raw, ended, err = s.responseOf(ctx, rec)
	}
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, raw)
}

// stopRunning cancels rec's request unless it has ended: its workflow
// hears the cancel, stops the model call and gives back its permit. A
// request that ended meanwhile needs nothing.
func (s *Server) stopRunning(ctx context.Context, rec responses.Record) error {
	if rec.Ended() {
		return nil
	}
	requestID, _ := answer.RequestID(rec.ID)
	err := s.follow.Cancel(ctx, requestID)
	var ae *refusal.Error
	if errors.As(err, &ae) && ae.Class == refusal.Conflict {
		return nil // it has already finished
	}
	return err
}
