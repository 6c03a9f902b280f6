package api

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.temporal.io/api/enums/v1"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/workflows"
)

func (s *Server) requestID(c echo.Context) (string, error) {
	id := c.Param("id")
	if !requestIDPattern.MatchString(id) {
		return "", badRequest("bad_request_id", "request id must look like chat-<ULID>")
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
	id, err := s.requestID(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	desc, err := s.temporal.DescribeWorkflowExecution(ctx, workflows.ChatWorkflowID(id), "")
	if err != nil {
		if isNotFound(err) {
			return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no such request"}
		}
		return err
	}
	info := desc.GetWorkflowExecutionInfo()
	view := requestView{
		RequestID: id,
		Workflow:  statusName(info.GetStatus()),
		StartedAt: info.GetStartTime().AsTime(),
	}
	if info.GetCloseTime() != nil {
		t := info.GetCloseTime().AsTime()
		view.ClosedAt = &t
	}
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if v, err := s.temporal.QueryWorkflow(qctx, workflows.ChatWorkflowID(id), "", workflows.QueryStatus); err == nil {
		var st workflows.Status
		if v.Get(&st) == nil {
			if st.Stage == workflows.StageAdmission && st.Pool != "" {
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
	id, err := s.requestID(c)
	if err != nil {
		return err
	}
	after := c.Request().Header.Get("Last-Event-ID")
	if after == "" {
		after = c.QueryParam("last_event_id")
	}
	if after == "" {
		after = "0"
	} else if !events.ValidID(after) {
		return badRequest("bad_last_event_id", "Last-Event-ID must be an event id such as 1700000000000-0")
	}
	ctx := c.Request().Context()
	ok, err := s.events.Exists(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no events for this request (unknown or expired)"}
	}
	sub, err := s.hub.Subscribe(ctx, id, after)
	if err != nil {
		return unavailable("event stream unavailable")
	}
	defer sub.Close()
	err = s.temporal.SignalWorkflow(ctx, workflows.ChatWorkflowID(id), "", workflows.SignalAttach, workflows.AttachSignal{})
	if err != nil && !isNotFound(err) {
		s.logger.Warn("signal attach", "requestID", id, "err", err)
	}
	return s.stream(c, sub, id)
}

func (s *Server) deleteRequest(c echo.Context) error {
	id, err := s.requestID(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	err = s.temporal.SignalWorkflow(ctx, workflows.ChatWorkflowID(id), "", workflows.SignalCancel, workflows.CancelSignal{Reason: "client_request"})
	if err != nil {
		if !isNotFound(err) {
			return err
		}
		// Not running: either finished or never existed.
		if _, derr := s.temporal.DescribeWorkflowExecution(ctx, workflows.ChatWorkflowID(id), ""); derr == nil {
			return &apiError{Status: http.StatusConflict, Code: "already_finished", Message: "the request has already finished"}
		}
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no such request"}
	}
	return c.JSON(http.StatusAccepted, map[string]string{"request_id": id, "status": "cancelling"})
}
