// Package request is the vocabulary of a chat request, spelled once: the
// pools a request is routed to and the rule that routes it, the stages it
// passes and the series they are timed under, and the ways it can end.
// The API, the workflows, the activities, the live policy, the capacity
// planner and the config all import these names instead of writing them.
package request

// Pools a request can be routed to, and the route of a request the answer
// cache served.
const (
	PoolShort = "short"
	PoolLong  = "long"
	// RouteCache is the route of a request answered by the answer cache:
	// it took no pool's permit.
	RouteCache = "cache"
)

// Pools lists the pool names in a fixed order (short first).
func Pools() []string { return []string{PoolShort, PoolLong} }

// IsPool reports whether name is a pool's name.
func IsPool(name string) bool { return name == PoolShort || name == PoolLong }

// Route picks the pool of a request whose prompt is at most promptBound
// tokens before its session's turns, plus historyTokens of those turns: a
// prompt of at most threshold tokens goes to the short pool. The door and
// admission both route with it, on the same inputs, so that the queue the
// door checks is the queue the request joins.
func Route(promptBound, historyTokens, threshold int) string {
	if promptBound+historyTokens <= threshold {
		return PoolShort
	}
	return PoolLong
}

// Stages of a request, in pipeline order, as its stage events, status
// query, timings and metrics name them.
const (
	StageEmbed       = "embed"
	StageAnswerCache = "answer_cache"
	StageAdmission   = "admission"
	StageRetrieval   = "retrieval"
	StageRerank      = "rerank"
	// StageLLMFirstToken times the LLM call up to its first token;
	// StageLLM the whole call.
	StageLLMFirstToken = "llm_first_token"
	StageLLM           = "llm"
	// StageFinished is the status of a request that has ended.
	StageFinished = "finished"
)

// Series of the shared latency window besides the stages: each request's
// time to its first token (its stages up to and including the first
// token, the admission queue among them), and the counters the healer's
// queue-timeout rate is made of.
const (
	SeriesTTFT          = "ttft"
	SeriesRequests      = "requests"
	SeriesQueueTimeouts = "queue_timeouts"
)

// TimedSeries lists every latency series a stage's tail can be watched on,
// in pipeline order.
func TimedSeries() []string {
	return []string{
		StageEmbed, StageAnswerCache, StageAdmission, StageRetrieval, StageRerank,
		StageLLMFirstToken, StageLLM, SeriesTTFT,
	}
}

// Outcomes of a request. A session also records OutcomeTruncated: answered,
// but cut at the length limit.
const (
	OutcomeDone      = "done"
	OutcomeTruncated = "truncated"
	OutcomeRejected  = "rejected"
	OutcomeCancelled = "cancelled"
	OutcomeFailed    = "failed"
)

// Reasons a request was refused, rejected or failed, as clients see them
// (the reason of rejected and error events, the code of a refusal).
const (
	ReasonQueueTimeout    = "queue_timeout"
	ReasonQueueFull       = "queue_full"
	ReasonTenantQueueFull = "tenant_queue_full"
	// ReasonDeadlineUnreachable: a request of a class that refuses late
	// requests (policy.ClassLimits.RefuseLate) could no longer get a
	// permit within its class's TTFT SLO.
	ReasonDeadlineUnreachable = "deadline_unreachable"
	ReasonCancelled           = "cancelled"
	ReasonStreamInterrupted   = "stream_interrupted"
	ReasonBackendError        = "backend_error"
	ReasonBadRequest          = "bad_request"
	ReasonInternal            = "internal_error"
	// ReasonShed: the healer dropped the request from an overloaded queue.
	ReasonShed = "shed"
	// ReasonBusy: the door had no slot to start the request's workflow.
	ReasonBusy = "busy"
	// ReasonRateLimited: a rate limit refused the request at the door.
	ReasonRateLimited = "rate_limited"
	// ReasonBudgetExceeded: the tenant's monthly budget could not hold
	// the request's upper bound; it resets when the month ends (UTC).
	ReasonBudgetExceeded = "budget_exceeded"
	// ReasonBackendUnavailable: every backend of the request's pool had
	// its circuit open; nothing was sent, and the client may retry after
	// retry_after_s.
	ReasonBackendUnavailable = "backend_unavailable"
	// ReasonUnavailable: something Sluice depends on (Redis, Temporal, an
	// embedding service) could not be reached for now; the client may
	// retry after retry_after_s. At the door it is a 503 refusal's code.
	ReasonUnavailable = "unavailable"
	// ReasonKBTooLarge: the kb would need more memory than a worker holds
	// for knowledge bases: refused at ingestion, and a query of one that
	// grew so anyway fails with it rather than be retried.
	ReasonKBTooLarge = "kb_too_large"
	// ReasonTooManyConnections: a new connection from an address that
	// has api.max_conns_per_ip open already (429).
	ReasonTooManyConnections = "too_many_connections"
	// ReasonConnectionsFull: a new connection to an API process that has
	// api.max_conns open already (503).
	ReasonConnectionsFull = "connections_full"
)

// Why a pool handed a request to its fallback (pools.<pool>.fallbacks),
// as the done event's fallback and the request's status say; a pool whose
// every circuit was open says ReasonBackendUnavailable.
const (
	// FallbackContextTooLong: the backend answered that the prompt
	// exceeds its model's context.
	FallbackContextTooLong = "context_length_exceeded"
	// FallbackFirstTokenTimeout: the first token missed its deadline on
	// every attempt.
	FallbackFirstTokenTimeout = "first_token_timeout"
)
