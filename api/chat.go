package api

import (
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
)

func (s *Server) postChat(c echo.Context) error {
	who, err := s.authenticateChat(c)
	if err != nil {
		return err
	}
	var req door.Request
	if err := httpio.DecodeJSON(c, &req, s.cfg.API.MaxBodyBytes); err != nil {
		return err
	}
	if err := s.door.Validate(&req); err != nil {
		return err
	}
	s.idempotency(c, &req, door.Fingerprint(c.Path(), req.Query, req.KB, req.SessionID, *req.MaxTokens))
	adm, err := s.admit(c, who, &req)
	if err != nil {
		return err
	}
	defer adm.Sub.Close()
	return s.stream(c, adm.Sub, adm.ID)
}

// idempotency copies what the door needs to resolve a POST's
// Idempotency-Key into req: the key, where a replay resumes, and the
// fingerprint a retry's body is compared by.
func (s *Server) idempotency(c echo.Context, req *door.Request, fingerprint string) {
	h := c.Request().Header
	req.IdempotencyKey, req.LastEventID, req.Fingerprint = h.Get(door.IdempotencyHeader), h.Get("Last-Event-ID"), fingerprint
}

// admit takes req through the door, and puts the headers the door
// decided (rate limits, a replay's mark) on the response either way.
func (s *Server) admit(c echo.Context, who door.Caller, req *door.Request) (door.Admission, error) {
	adm, err := s.door.Admit(c.Request().Context(), who, req)
	for k, v := range adm.Header {
		c.Response().Header()[k] = v
	}
	return adm, err
}
