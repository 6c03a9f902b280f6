package activities

import (
	"time"

	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
)

// report records a finished request in the metrics and, for requests that
// reached a pool, in the shared latency window: each stage's time under
// "<stage>/<pool>", the time to the first token under "ttft/<pool>", and
// the counters "requests/<pool>" and "queue_timeouts/<pool>" the healer's
// timeout rate is made of.
func (a *Chat) report(r Report) {
	a.Metrics.ObserveRequest(metrics.Request{
		Route: r.Route, Outcome: metrics.OutcomeOf(r.Outcome, r.Reason), Tier: r.Tier, Timings: r.Timings,
		PromptTokens: r.Usage.PromptTokens, CompletionTokens: r.Usage.CompletionTokens,
	})
	if a.Latency == nil || !request.IsPool(r.Route) {
		return
	}
	for _, t := range r.Timings {
		a.Latency.Record(latency.Series(t.Stage, r.Route), time.Duration(t.Ms)*time.Millisecond)
	}
	// Unlike llm_first_token, the time to the first token counts the
	// admission queue, so a healer watching it sees waits that shrinking
	// a pool moves there.
	if ttft, ok := metrics.TimeToFirstToken(r.Timings); ok {
		a.Latency.Record(latency.Series(request.SeriesTTFT, r.Route), ttft)
	}
	a.Latency.Add(latency.Series(request.SeriesRequests, r.Route), 1)
	if r.Reason == request.ReasonQueueTimeout || r.Reason == request.ReasonDeadlineUnreachable {
		a.Latency.Add(latency.Series(request.SeriesQueueTimeouts, r.Route), 1)
	}
}

// countService counts the tokens a request that reached a pool was served
// against its tenant (metrics.TenantService): Finalize's first attempt
// calls it, with the log line, so each request counts once. Only an
// answer's usage is in the report; a stream that failed or was cancelled
// midway reported its total to the workflow for the rate-limit refund
// alone, and is not counted.
func (a *Chat) countService(r Report) {
	if !request.IsPool(r.Route) || r.Usage.PromptTokens <= 0 && r.Usage.CompletionTokens <= 0 {
		return
	}
	a.Metrics.TenantServed(metrics.TenantService{
		Tenant: r.Tenant, Pool: r.Route, Tier: r.Tier,
		PromptTokens: r.Usage.PromptTokens, CompletionTokens: r.Usage.CompletionTokens,
	})
}
