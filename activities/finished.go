package activities

import (
	"context"
	"strings"

	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/tracing"
)

// logFinished writes the request's one log line (request.Finished) from
// what the workflow reported and the trace Finalize runs in.
func (a *Chat) logFinished(ctx context.Context, requestID string, r Report) {
	f := request.Finished{
		RequestID: requestID, Tenant: r.Tenant, Route: r.Route, Outcome: r.Outcome, Reason: r.Reason,
		PromptTokens: r.Usage.PromptTokens, CompletionTokens: r.Usage.CompletionTokens,
		Cached: cachedBy(r), TraceID: tracing.TraceID(ctx), ServiceTier: r.ServiceTier,
	}
	for _, t := range r.Timings {
		f.Stages = append(f.Stages, request.StageTime{Stage: t.Stage, Ms: t.Ms})
	}
	if ttft, ok := metrics.TimeToFirstToken(r.Timings); ok {
		f.TTFT = ttft
	}
	f.Log(ctx, a.Logger)
}

// cacheNames name the stage caches in the log line.
var cacheNames = map[string]string{request.StageEmbed: "embedding", request.StageRetrieval: "retrieval"}

// cachedBy says which caches served a request (request.Finished.Cached).
func cachedBy(r Report) string {
	if r.Route == request.RouteCache {
		return "answer"
	}
	var hits []string
	for _, t := range r.Timings {
		name, ok := cacheNames[t.Stage]
		if ok && t.Cache != "" && t.Cache != "miss" {
			hits = append(hits, name+":"+t.Cache)
		}
	}
	return strings.Join(hits, ",")
}
