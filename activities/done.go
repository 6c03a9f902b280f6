package activities

import (
	"context"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/tracing"
)

// DoneFacts is what the workflow knows of a request when it hands its end
// to an activity: the activity that answers builds the done event from
// them (doneEvent), adding what it measured.
type DoneFacts struct {
	RequestID string
	// Route is the pool the request ran in (request.RouteCache is set by
	// the cached-answer path itself).
	Route     string
	KBVersion int64
	// Timings are the stages the workflow timed so far, in order.
	Timings []events.StageTiming
	// Fallback, if set, is the last fallback the request took: the
	// answer comes from its target.
	Fallback *events.Fallback `json:",omitempty"`
	// ServiceTier is the service class the request is served in; the
	// done event says it.
	ServiceTier string `json:",omitempty"`
}

// Answer is what the activity that answered knows of the answer.
type Answer struct {
	FinishReason string
	// FinishReasons are every choice's, when several were asked for.
	FinishReasons []string
	Usage         events.Usage
	Sources       []string
	ContextShed   int
	// Model is the model that answered; empty for a cached answer.
	Model string
	// Cached: served from the answer cache, with no LLM call.
	Cached bool
	// KBVersion, if not 0, is the kb version the answer was made at, when
	// the activity learnt it (the answer cache's lookup).
	KBVersion int64
	// Timings are the answering stage's own, after the workflow's.
	Timings []events.StageTiming
	// Pauses is how often the stream was paused for a more urgent
	// request.
	Pauses int
}

// doneEvent is the request's done event: the one place it is built, from
// the workflow's facts, the answer, and the request's trace.
func doneEvent(ctx context.Context, f DoneFacts, ans Answer) events.Done {
	d := events.Done{
		RequestID: f.RequestID, Route: f.Route, KBVersion: f.KBVersion,
		Timings:      append(append([]events.StageTiming(nil), f.Timings...), ans.Timings...),
		FinishReason: ans.FinishReason, Usage: ans.Usage, Sources: ans.Sources, ContextShed: ans.ContextShed,
		Model: ans.Model, Cached: ans.Cached, TraceID: tracing.TraceID(ctx), Fallback: f.Fallback,
		ServiceTier: f.ServiceTier, Pauses: ans.Pauses,
	}
	if ans.KBVersion != 0 {
		d.KBVersion = ans.KBVersion
	}
	if len(ans.FinishReasons) > 1 {
		d.FinishReasons = ans.FinishReasons
	}
	return d
}
