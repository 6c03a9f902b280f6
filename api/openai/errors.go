package openai

import (
	"net/http"

	"github.com/sluice-dev/sluice/pkg/httperr"
	"github.com/sluice-dev/sluice/pkg/openai"
)

// ErrorBody renders e in OpenAI's shape; the type follows from the status as
// OpenAI's do, the code is Sluice's.
func ErrorBody(e *httperr.Error) openai.ErrorResponse {
	out := openai.Error{Message: e.Message, Code: openai.Code(e.Code), Type: "invalid_request_error", Param: openai.Null[string]()}
	if e.Param != "" {
		out.Param = openai.Of(e.Param)
	}
	switch {
	case e.Status == http.StatusUnauthorized:
		out.Type = "authentication_error"
	case e.Status == http.StatusForbidden:
		out.Type = "permission_error"
	case e.Status == http.StatusNotFound:
		out.Type = "not_found_error"
	case e.Status == http.StatusTooManyRequests:
		out.Type = "rate_limit_error"
	case e.Status >= 500:
		out.Type = "server_error"
	}
	return openai.ErrorResponse{Error: out}
}
