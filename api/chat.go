package api

import (
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
)

// chatBody is the body of POST /v1/chat.
type chatBody struct {
	Query     string `json:"query"`
	KB        string `json:"kb"`
	SessionID string `json:"session_id"`
	MaxTokens *int   `json:"max_tokens"`
	// ServiceTier asks for a service class (OpenAI's service_tier):
	// priority, default, flex, or auto (the plan's default).
	ServiceTier string `json:"service_tier"`
}

func (b chatBody) request() door.Request {
	return door.Request{Query: b.Query, KB: b.KB, SessionID: b.SessionID, MaxTokens: b.MaxTokens, ServiceTier: b.ServiceTier}
}

// fingerprint is what a retry of the request is compared by: a request
// that names no service_tier keeps the fingerprint it had before the
// field was read.
func fingerprint(path string, req door.Request) string {
	parts := []any{req.Query, req.KB, req.SessionID, *req.MaxTokens}
	if req.ServiceTier != "" {
		parts = append(parts, req.ServiceTier)
	}
	return door.Fingerprint(path, parts...)
}

func (s *Server) postChat(c echo.Context) error {
	who, err := s.authenticateChat(c)
	if err != nil {
		return err
	}
	req, err := s.chatRequest(c)
	if err != nil {
		return err
	}
	adm, err := httpio.Admit(c, s.door, who, &req, fingerprint(c.Path(), req))
	if err != nil {
		return err
	}
	defer adm.Sub.Close()
	return s.stream(c, adm.Sub, adm.ID)
}

// chatRequest decodes and validates the body of POST /v1/chat.
func (s *Server) chatRequest(c echo.Context) (door.Request, error) {
	var body chatBody
	if err := httpio.DecodeJSON(c, &body, s.cfg.API.MaxBodyBytes); err != nil {
		return door.Request{}, err
	}
	req := body.request()
	return req, s.door.Validate(&req)
}
