package api

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// codecBodyLimit bounds one codec request: the payloads of one history
// event, which Temporal bounds to a few MB (blob size limit 2 MB, gRPC
// message 4 MB by default).
const codecBodyLimit = 8 << 20

// routeCodec serves the codec server protocol at /codec/decode and
// /codec/encode with the process's keyring (when codec.enabled), for the Temporal CLI
// (--codec-endpoint <api>/codec --codec-auth 'Bearer <admin key>') and the
// Temporal UI. It sits on the API's own port, behind its TLS and
// ingress, rather than on a listener of its own: one address to expose
// and one credential (the admin key) to hand operators.
func (s *Server) routeCodec(e *echo.Echo) {
	if s.codec == nil {
		return
	}
	h := codec.Handler(s.codec, codecBodyLimit)
	serve := func(c echo.Context) error {
		if err := s.codecCaller(c); err != nil {
			return err
		}
		h.ServeHTTP(c.Response(), c.Request())
		return nil
	}
	var mw []echo.MiddlewareFunc
	methods := []string{http.MethodPost}
	if origins := s.cfg.Codec.UIOrigins; len(origins) > 0 {
		// The UI calls the codec from the browser, from its own origin.
		// Echo's CORS middleware answers the preflight (OPTIONS, which
		// carries no credentials) itself. Without origins there is no
		// CORS: echo would take an empty list for "*".
		mw = append(mw, middleware.CORSWithConfig(middleware.CORSConfig{
			AllowOrigins:     origins,
			AllowMethods:     []string{http.MethodPost},
			AllowHeaders:     []string{echo.HeaderContentType, echo.HeaderAuthorization, "X-Namespace"},
			AllowCredentials: true,
			MaxAge:           600,
		}))
		methods = append(methods, http.MethodOptions)
	}
	e.Match(methods, "/codec/decode", serve, mw...)
	e.Match(methods, "/codec/encode", serve, mw...)
}

// codecCaller lets through a caller holding the admin key or a key with
// the admin scope: decoding reads every user's questions and answers. A
// refused credential counts against the bans, so the admin key cannot be
// guessed here either; an accepted one does not, since the UI decodes
// each payload of a history by a request of its own and an operator
// reading a long history would ban their own address.
func (s *Server) codecCaller(c echo.Context) error {
	if !s.adminEnabled() {
		return &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "the codec endpoint needs an admin credential (set auth.admin_key or give a key the admin scope)"}
	}
	keyID, err := s.adminCaller(c)
	if err == nil {
		return nil
	}
	if banErr := s.checkBans(c, &door.Caller{KeyID: keyID}, err); banErr != nil {
		return banErr
	}
	return err
}
