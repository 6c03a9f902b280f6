// Package httperr is the error a client hears: an HTTP status, a code and
// a message, rendered as {"error": {...}} with an optional Retry-After
// header. The door refuses with it and the HTTP handlers answer with it,
// so a refusal is spelled in one type whoever decides it.
package httperr

import (
	"fmt"
	"net/http"

	"github.com/sluice-dev/sluice/pkg/request"
)

// Error is every error response.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Dimension and Kind name the rate limit that refused (429, 413).
	Dimension  string `json:"dimension,omitempty"`
	Kind       string `json:"kind,omitempty"`
	RetryAfter int    `json:"retry_after_s,omitempty"`
	// Param names the request field at fault, for OpenAI-shaped errors.
	Param string `json:"-"`
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// BadRequest is a 400 with code and a formatted message.
func BadRequest(code, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Unavailable is a 503 for a dependency that cannot serve now: the client
// may retry in a second.
func Unavailable(msg string) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: request.ReasonUnavailable, Message: msg, RetryAfter: 1}
}

// Refused is the refusal of a request turned away with f (request.Refused
// builds it: one message and one Retry-After rounding for a reason,
// whoever refuses), answered with status.
func Refused(status int, f request.Failure) *Error {
	return &Error{Status: status, Code: f.Reason, Message: f.Message, RetryAfter: f.RetryAfterS}
}
