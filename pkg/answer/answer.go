package answer

import (
	"encoding/json"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// ServiceTierOf is the class an accepted event says its request is
// served in ("" when it says none).
func ServiceTierOf(ev events.Event) string {
	var acc events.Accepted
	if json.Unmarshal(ev.Data, &acc) != nil {
		return ""
	}
	return acc.ServiceTier
}

// FinishReason maps a backend's finish reason to one of OpenAI's: a
// backend may say "eos" or nothing where OpenAI says "stop".
func FinishReason(r string) string {
	switch r {
	case openai.FinishLength, openai.FinishContentFilter, openai.FinishToolCalls:
		return r
	}
	return openai.FinishStop
}

// Failure is the HTTP error a rejected or error event amounts to.
func Failure(ev events.Event) *refusal.Error {
	var f events.Failure
	if err := json.Unmarshal(ev.Data, &f); err != nil || f.Reason == "" {
		return &refusal.Error{Class: refusal.Internal, Code: request.ReasonInternal, Message: "the request failed"}
	}
	class := refusal.Internal
	switch f.Reason {
	case request.ReasonQueueTimeout, request.ReasonQueueFull, request.ReasonTenantQueueFull, request.ReasonShed,
		request.ReasonBackendUnavailable, request.ReasonUnavailable, request.ReasonDeadlineUnreachable:
		class = refusal.Unavailable
	case request.ReasonBackendError, request.ReasonStreamInterrupted:
		class = refusal.Upstream
	case request.ReasonBadRequest, request.ReasonKBTooLarge:
		class = refusal.Invalid
	case request.ReasonCancelled:
		// Not a status clients retry: someone meant it to stop.
		class = refusal.Gone
	}
	return refusal.Refused(class, f)
}
