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
	adm, err := httpio.Admit(c, s.door, who, &req, door.Fingerprint(c.Path(), req.Query, req.KB, req.SessionID, *req.MaxTokens))
	if err != nil {
		return err
	}
	defer adm.Sub.Close()
	return s.stream(c, adm.Sub, adm.ID)
}
