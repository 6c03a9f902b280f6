package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/labstack/echo/v4"
	"go.temporal.io/api/serviceerror"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/api/openai"
	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var ae *refusal.Error
	var he *echo.HTTPError
	status := 0
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &he):
		// Echo's own refusals (no route, a method the route does not
		// take, a body too large) keep their status.
		status = he.Code
		ae = &refusal.Error{Class: httpio.ClassOf(he.Code), Code: http.StatusText(he.Code), Message: fmt.Sprint(he.Message)}
		switch he.Code {
		case http.StatusNotFound:
			ae.Code, ae.Message = "not_found", "no such route"
		case http.StatusMethodNotAllowed:
			ae.Code, ae.Message = "method_not_allowed", "method not allowed on this route"
		case http.StatusRequestEntityTooLarge:
			ae.Code = "body_too_large"
		}
	case dependencyFailed(err):
		s.logger.Warn("request failed: a dependency was unavailable", "method", c.Request().Method, "path", c.Path(), "err", err)
		ae = refusal.Unreachable("a service Sluice depends on is not answering; please retry")
	default:
		s.logger.Error("request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
		ae = &refusal.Error{Class: refusal.Internal, Code: "internal_error", Message: "internal error"}
	}
	if ae.RetryAfter > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(ae.RetryAfter))
	}
	var body any = map[string]*refusal.Error{"error": ae}
	if openai.IsPath(c.Path()) {
		body = openai.ErrorBody(ae)
	}
	if status == 0 {
		status = httpio.Status(ae.Class)
	}
	if err := c.JSON(status, body); err != nil {
		s.logger.Warn("write error response", "err", err)
	}
}

// dependencyFailed says whether err, which no handler turned into an
// answer, is Redis or Temporal failing now (unreachable, failing over,
// overloaded, or too slow for the request's deadline) rather than a bug:
// the client is told to retry, with nothing of the error's text, which
// names addresses and servers.
func dependencyFailed(err error) bool {
	var unavailable *serviceerror.Unavailable
	var deadline *serviceerror.DeadlineExceeded
	var exhausted *serviceerror.ResourceExhausted
	return conn.Unreachable(err) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &unavailable) || errors.As(err, &deadline) || errors.As(err, &exhausted)
}

// recoverJSON turns a handler panic into a JSON 500 instead of a dropped
// connection, and logs it.
func (s *Server) recoverJSON(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				s.logger.Error("handler panic", "path", c.Path(), "panic", r)
				err = &refusal.Error{Class: refusal.Internal, Code: "internal_error", Message: "internal error"}
			}
		}()
		return next(c)
	}
}

// checkQuery refuses a query string that does not parse (a bad percent
// escape, a semicolon) with 400 bad_query. Echo's query reads drop the
// pairs that do not parse, so ?cursor=%%% would otherwise read as no
// cursor and answer the first page as if that were asked.
func checkQuery(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if raw := c.Request().URL.RawQuery; raw != "" {
			if _, err := url.ParseQuery(raw); err != nil {
				return refusal.BadRequest("bad_query_string", "the query string does not parse: %v", err)
			}
		}
		return next(c)
	}
}
