package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.temporal.io/api/enums/v1"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

var errNoRequest = &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "no such request (unknown, expired, or not yours)"}

// ownRequest authenticates the caller and checks that the request in the
// path is theirs: sent by its tenant and user, as its accepted event
// says. Another tenant's or user's request is reported as not found, so
// ids reveal nothing (a request holds its sender's query and answer).
// Requests are known while their event stream lives (events.ttl).
func (s *Server) ownRequest(c echo.Context, route string) (string, error) {
	who, err := s.authenticateFor(c, route)
	if err != nil {
		return "", err
	}
	id := c.Param("id")
	if !door.ValidRequestID(id) {
		return "", refusal.BadRequest("bad_request_id", "request id must look like chat-<ULID>")
	}
	first, ok, err := s.events.First(c.Request().Context(), id)
	if err != nil {
		return "", refusal.Unreachable("event store unavailable")
	}
	var acc events.Accepted
	if !ok || first.Type != events.TypeAccepted || json.Unmarshal(first.Data, &acc) != nil ||
		acc.Tenant != who.Tenant || acc.User != who.User {
		return "", errNoRequest
	}
	return id, nil
}

// requestView is the body of GET /v1/requests/:id.
type requestView struct {
	RequestID string            `json:"request_id"`
	Workflow  string            `json:"workflow_status"`
	StartedAt time.Time         `json:"started_at"`
	ClosedAt  *time.Time        `json:"closed_at,omitempty"`
	Status    *workflows.Status `json:"status,omitempty"`
	// LastEventID lets a client resume the event stream from here.
	LastEventID string `json:"last_event_id,omitempty"`
}

func (s *Server) getRequest(c echo.Context) error {
	id, err := s.ownRequest(c, policy.RouteReads)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	desc, err := s.temporal.DescribeWorkflow(ctx, workflows.ChatWorkflowID(id), "")
	if err != nil {
		if conn.NotFound(err) {
			return errNoRequest
		}
		return refusal.Unreachable("workflow service unavailable")
	}
	view := requestView{
		RequestID: id,
		Workflow:  statusName(desc.Status),
		StartedAt: desc.WorkflowStartTime,
		ClosedAt:  desc.WorkflowCloseTime,
	}
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if v, err := s.temporal.QueryWorkflow(qctx, workflows.ChatWorkflowID(id), "", workflows.QueryStatus); err == nil {
		var st workflows.Status
		if v.Get(&st) == nil {
			if st.Stage == request.StageAdmission && st.Pool != "" {
				// The workflow knows its position only as of its last
				// check; Redis knows it now.
				if pos, ok, err := s.gate.Position(ctx, st.Pool, id); err == nil && ok {
					st.Position = pos
				}
			}
			view.Status = &st
		}
	} else {
		s.logger.Debug("query status", "requestID", id, "err", err)
	}
	if last, ok, err := s.events.Last(ctx, id); err == nil && ok {
		view.LastEventID = last.ID
	}
	return c.JSON(http.StatusOK, view)
}

func statusName(st enums.WorkflowExecutionStatus) string {
	switch st {
	case enums.WORKFLOW_EXECUTION_STATUS_RUNNING:
		return "running"
	case enums.WORKFLOW_EXECUTION_STATUS_COMPLETED:
		return "completed"
	case enums.WORKFLOW_EXECUTION_STATUS_FAILED:
		return "failed"
	case enums.WORKFLOW_EXECUTION_STATUS_CANCELED:
		return "canceled"
	case enums.WORKFLOW_EXECUTION_STATUS_TERMINATED:
		return "terminated"
	case enums.WORKFLOW_EXECUTION_STATUS_TIMED_OUT:
		return "timed_out"
	case enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW:
		return "continued_as_new"
	}
	return "unknown"
}

// getEvents resumes a request's stream after Last-Event-ID (header, or the
// last_event_id query parameter for clients that cannot set headers).
func (s *Server) getEvents(c echo.Context) error {
	after := c.Request().Header.Get("Last-Event-ID")
	if after == "" {
		after = c.QueryParam("last_event_id")
	}
	if after == "" {
		after = "0-0"
	} else if !events.ValidID(after) {
		return refusal.BadRequest("bad_last_event_id", "Last-Event-ID must be an event id such as 1700000000000-0")
	}
	id, err := s.ownRequest(c, policy.RouteResumes)
	if err != nil {
		return err
	}
	sub, err := s.follow.Resume(c.Request().Context(), id, after)
	if errors.Is(err, follow.ErrAlreadySent) {
		// An EventSource reconnects after every close; 204 tells it to
		// stop.
		return c.NoContent(http.StatusNoContent)
	}
	if err != nil {
		return err
	}
	defer sub.Close()
	return s.stream(c, sub, id)
}

func (s *Server) deleteRequest(c echo.Context) error {
	id, err := s.ownRequest(c, policy.RouteReads)
	if err != nil {
		return err
	}
	if err := s.follow.Cancel(c.Request().Context(), id); err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, map[string]string{"request_id": id, "status": "cancelling"})
}
