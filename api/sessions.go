package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/session"
)

// sessionResponse is the body of GET /v1/sessions/:id.
type sessionResponse struct {
	ID    string         `json:"id"`
	Turns []session.Turn `json:"turns"`
}

// sessionParam authenticates the caller and checks the session id; a
// session belongs to the caller's user, so another user's or tenant's
// session of the same id is not found (404), never confirmed to exist.
func (s *Server) sessionParam(c echo.Context) (door.Caller, string, error) {
	who, err := s.authenticateFor(c, policy.RouteReads)
	if err != nil {
		return door.Caller{}, "", err
	}
	if s.sessions == nil {
		return door.Caller{}, "", &refusal.Error{Class: refusal.NotFound, Code: "sessions_disabled", Message: "sessions are not enabled on this server"}
	}
	id := c.Param("id")
	if !door.ValidSessionID(id) {
		return door.Caller{}, "", refusal.BadRequest("bad_session_id", "session id must be 1-128 characters of letters, digits and ._:-")
	}
	return who, id, nil
}

// getSession returns a session's turns, oldest first; 404 when it has
// none (never started, expired or forgotten).
func (s *Server) getSession(c echo.Context) error {
	who, id, err := s.sessionParam(c)
	if err != nil {
		return err
	}
	turns, err := s.sessions.Turns(c.Request().Context(), who.SessionOwner(), id)
	if err != nil {
		s.logger.Error("read session", "session", id, "err", err)
		return refusal.Unreachable("sessions unavailable; please retry")
	}
	if len(turns) == 0 {
		return &refusal.Error{Class: refusal.NotFound, Code: "session_not_found", Message: "no such session"}
	}
	return c.JSON(http.StatusOK, sessionResponse{ID: id, Turns: turns})
}

// deleteSession forgets a session: 204 if it existed, 404 if not.
func (s *Server) deleteSession(c echo.Context) error {
	who, id, err := s.sessionParam(c)
	if err != nil {
		return err
	}
	existed, err := s.sessions.Forget(c.Request().Context(), who.SessionOwner(), id)
	if err != nil {
		s.logger.Error("forget session", "session", id, "err", err)
		return refusal.Unreachable("sessions unavailable; please retry")
	}
	if !existed {
		return &refusal.Error{Class: refusal.NotFound, Code: "session_not_found", Message: "no such session"}
	}
	return c.NoContent(http.StatusNoContent)
}
