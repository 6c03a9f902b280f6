package openai

import (
	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// ErrorBody renders e in OpenAI's shape; the type follows from the class as
// OpenAI's follows from the status, the code is Sluice's.
func ErrorBody(e *refusal.Error) openai.ErrorResponse {
	out := openai.Error{Message: e.Message, Code: openai.Code(e.Code), Type: "invalid_request_error", Param: openai.Null[string]()}
	if e.Param != "" {
		out.Param = openai.Of(e.Param)
	}
	switch {
	case e.Class == refusal.Unauthenticated:
		out.Type = "authentication_error"
	case e.Class == refusal.Forbidden:
		out.Type = "permission_error"
	case e.Class == refusal.NotFound:
		out.Type = "not_found_error"
	case e.Class == refusal.Limited:
		out.Type = "rate_limit_error"
	case httpio.Status(e.Class) >= 500:
		out.Type = "server_error"
	}
	return openai.ErrorResponse{Error: out}
}
