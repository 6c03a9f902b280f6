package httpio

import (
	"net/http"

	"github.com/sluice-dev/sluice/pkg/refusal"
)

// statuses is each refusal class's HTTP status.
var statuses = map[refusal.Class]int{
	refusal.Internal:         http.StatusInternalServerError,
	refusal.Invalid:          http.StatusBadRequest,
	refusal.Unauthenticated:  http.StatusUnauthorized,
	refusal.Forbidden:        http.StatusForbidden,
	refusal.NotFound:         http.StatusNotFound,
	refusal.Timeout:          http.StatusRequestTimeout,
	refusal.Conflict:         http.StatusConflict,
	refusal.Gone:             http.StatusGone,
	refusal.TooLarge:         http.StatusRequestEntityTooLarge,
	refusal.UnsupportedMedia: http.StatusUnsupportedMediaType,
	refusal.Unprocessable:    http.StatusUnprocessableEntity,
	refusal.Limited:          http.StatusTooManyRequests,
	refusal.Upstream:         http.StatusBadGateway,
	refusal.Unavailable:      http.StatusServiceUnavailable,
}

// Status is the HTTP status a refusal of class c is answered with.
func Status(c refusal.Class) int {
	if s, ok := statuses[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// ClassOf is the refusal class of an HTTP status, for errors that arrive
// as a status (Echo's own: no route, method not allowed, body too large);
// a status no class has is Invalid (4xx) or Internal (5xx).
func ClassOf(status int) refusal.Class {
	for c, s := range statuses {
		if s == status {
			return c
		}
	}
	if status >= 500 {
		return refusal.Internal
	}
	return refusal.Invalid
}
