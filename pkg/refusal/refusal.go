// Package refusal is the error a client hears when Sluice turns a request
// away, in no transport's terms: a class (what kind of refusal it is, which
// each transport maps to its own status; api/httpio maps it to HTTP), a
// code and a message, with the retry advice and the limit or field at
// fault. The door refuses with it and the HTTP handlers answer with it, so
// a refusal is spelled in one type whoever decides it.
package refusal

import (
	"fmt"

	"github.com/sluice-dev/sluice/pkg/request"
)

// Class is what kind of refusal an Error is. The zero value is Internal:
// a refusal nobody classified is Sluice's fault, not the client's.
type Class uint8

const (
	// Internal: Sluice failed; nothing the client did.
	Internal Class = iota
	// Invalid: the request is malformed or asks for what cannot be.
	Invalid
	// Unauthenticated: no credential, or one that names no key.
	Unauthenticated
	// Forbidden: the caller may not do this.
	Forbidden
	// NotFound: what the request names does not exist for the caller.
	NotFound
	// Timeout: the client took too long to send its request.
	Timeout
	// Conflict: the request contradicts the state of what it names.
	Conflict
	// Gone: the request was ended on purpose (cancelled).
	Gone
	// TooLarge: the request is larger than any limit lets through.
	TooLarge
	// UnsupportedMedia: the body is not in a format Sluice reads.
	UnsupportedMedia
	// Unprocessable: well formed, but not acceptable as sent (an
	// Idempotency-Key reused with another body).
	Unprocessable
	// Limited: a rate limit, budget or ban refused it for now.
	Limited
	// Upstream: the model backend failed.
	Upstream
	// Unavailable: Sluice or something it depends on cannot take the
	// request now; a retry after RetryAfter may well pass.
	Unavailable
)

var classNames = [...]string{
	Internal: "internal", Invalid: "invalid", Unauthenticated: "unauthenticated", Forbidden: "forbidden",
	NotFound: "not_found", Timeout: "timeout", Conflict: "conflict", Gone: "gone", TooLarge: "too_large",
	UnsupportedMedia: "unsupported_media", Unprocessable: "unprocessable", Limited: "limited",
	Upstream: "upstream", Unavailable: "unavailable",
}

// Classes are every class, for tests of a transport's mapping.
func Classes() []Class {
	out := make([]Class, len(classNames))
	for i := range classNames {
		out[i] = Class(i)
	}
	return out
}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", c)
}

// Error is every refusal.
type Error struct {
	Class   Class  `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Dimension and Kind name the rate limit or budget that refused
	// (Limited, TooLarge).
	Dimension  string `json:"dimension,omitempty"`
	Kind       string `json:"kind,omitempty"`
	RetryAfter int    `json:"retry_after_s,omitempty"`
	// Param names the request field at fault, for OpenAI-shaped errors.
	Param string `json:"-"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s %s: %s", e.Class, e.Code, e.Message) }

// BadRequest is an Invalid refusal with code and a formatted message.
func BadRequest(code, format string, args ...any) *Error {
	return &Error{Class: Invalid, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Unreachable refuses a request because something Sluice depends on
// cannot serve now: the client may retry in a second.
func Unreachable(msg string) *Error {
	return &Error{Class: Unavailable, Code: request.ReasonUnavailable, Message: msg, RetryAfter: 1}
}

// Refused is the refusal of a request turned away with f (request.Refused
// builds it: one message and one Retry-After rounding for a reason,
// whoever refuses), of class c.
func Refused(c Class, f request.Failure) *Error {
	return &Error{Class: c, Code: f.Reason, Message: f.Message, RetryAfter: f.RetryAfterS}
}
