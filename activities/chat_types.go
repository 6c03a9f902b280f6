package activities

import (
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Error types of application errors activities return, so that the
// workflow can tell business outcomes from faults.
const (
	ErrTypeStreamInterrupted = "StreamInterrupted"
	ErrTypeCancelled         = "Cancelled"
	ErrTypeBackend           = "BackendError"
	// ErrTypeBackendUnavailable: every endpoint of the request's pool has
	// its circuit open, so nothing was sent; its details are a
	// BackendUnavailable saying when to retry.
	ErrTypeBackendUnavailable = "BackendUnavailable"
	ErrTypeBadRequest         = "BadRequest"
	// ErrTypeFallback: the pool could not answer before a first token in
	// a way its next fallback may (LLMInput.FallBack); details Fallen
	// say why. Never retried: the workflow moves on to the fallback.
	ErrTypeFallback = "Fallback"
	// ErrTypePermitLost: the request's permit was reclaimed (its lease ran
	// out) before its stream started; it must queue again.
	ErrTypePermitLost = "PermitLost"
	// ErrTypeShed: the healer shed the request from its queue (Admit
	// after the shed, when its cancel signal has not arrived yet); the
	// workflow rejects it with reason shed.
	ErrTypeShed = "Shed"
	// ErrTypeOutOfBounds: a healing action asked for a value outside the
	// pool's configured bounds; retrying cannot help.
	ErrTypeOutOfBounds = "OutOfBounds"
	// ErrTypeNoScaler: Scale on a pool without a scaler.
	ErrTypeNoScaler = "NoScaler"
	// ErrTypeDependencyUnavailable: a dependency (Redis, an embedding or
	// rerank service) could not be reached or could not serve for now
	// (conn.Unreachable); retryable. A request that ends with it is told
	// to retry, not that Sluice failed.
	ErrTypeDependencyUnavailable = "DependencyUnavailable"
	// ErrTypeScaleRefused: the scaler refused for good (scaler.Permanent:
	// bad count, target not found, no permission).
	ErrTypeScaleRefused = "ScaleRefused"
	// ErrTypeKBTooLarge: the request's kb needs more memory than a worker
	// holds for knowledge bases, so no worker can search it; the workflow
	// fails the request with reason kb_too_large.
	ErrTypeKBTooLarge = "KBTooLarge"
)

// EmbedInput asks for the query's embedding (the L1 cache tier).
type EmbedInput struct {
	RequestID string
	Query     string
}

// EmbedOutput reports how the embedding was served. The vector itself stays
// in the embedding cache (retrieval reads it there) instead of bloating the
// workflow history.
type EmbedOutput struct {
	Cache string
	Dims  int
	Ms    int64
}

// AdmitInput asks for a permit, or re-checks a queued request.
type AdmitInput struct {
	RequestID string
	Query     string
	// KB is the kb's key (kbref.Ref.Key), its owner's and its name.
	KB        string
	MaxTokens int
	// Tenant, Weight (its tier's share) and MaxPerTenant (its tier's cap
	// on waiting requests) place it in the weighted fair queue;
	// MaxConcurrent is its tier's cap on the permits the tenant holds (0:
	// none).
	Tenant        string
	Weight        int
	MaxPerTenant  int
	MaxConcurrent int
	// Tokens is the request's size in the queue's token-fair order (the
	// door's estimate, ChatInput.AdmissionTokens); 0 counts it as one
	// typical request.
	Tokens int
	// Place is the request's place in the fair order, reserved at the
	// door (first call only; Tag 0: none).
	Place request.Place `json:",omitzero"`
	// Pool is empty on the first call (the activity routes the request);
	// re-checks pass the pool and Seq from the first call's output.
	Pool string
	Seq  int64
	// PromptBound, if not 0, is the prompt's upper bound before retrieval
	// (without session history) as the answer-cache lookup counted it.
	PromptBound int
	// Recheck marks a fallback re-check (no stage event is written).
	Recheck bool
	// WaitFor, if not 0, is how long the request will wait for its grant
	// from this call (what is left of its max wait): it will not re-check,
	// so its queue place is kept live that long (plus a margin for the
	// workflow's timer to fire and its last look to arrive) instead of
	// for the re-check cadence.
	WaitFor time.Duration
	// FastWait: how long to wait here for the grant when the request's
	// turn is near (first call only; 0: not at all).
	FastWait time.Duration
	// Session, if set, is the conversation whose earlier turns the prompt
	// will carry: routing counts them (first call only).
	Session *SessionRef
	// ServiceTier is the request's service class (request.Classes; "" is
	// the default class): a waiter of an urgent class may have a less
	// urgent stream paused for it (admission.preemption).
	ServiceTier string `json:",omitempty"`
	// Deadline and SLO order the request among its tenant's own in the
	// queue (admission.Request.Deadline, SLO); zero: no deadline.
	Deadline time.Time     `json:",omitzero"`
	SLO      time.Duration `json:",omitempty"`
}

// SessionRef names a request's conversation and how much of it the
// prompt may carry.
type SessionRef struct {
	// Tenant and User own the session (session.Owner).
	Tenant string
	User   string
	ID     string
	// HistoryTokens bounds the earlier turns in the prompt (0: none).
	HistoryTokens int
}

// AdmitOutput is the admission state.
type AdmitOutput struct {
	Pool    string
	Granted bool
	// Full: the pool's queue is at its cap; TenantFull: the tenant's share
	// of it is.
	Full       bool
	TenantFull bool
	// Position is 1-based while queued.
	Position        int
	EstimatedWaitMs int64
	// MayPause: the request queued, and a stream of a less urgent class may
	// be paused for it (preemption): its wait is not the permit turnover
	// EstimatedWaitMs reckons, so a class that refuses late requests does
	// not refuse it by that estimate.
	MayPause bool
	Seq      int64
	// EstimatedPromptTokens is the upper bound routing used; HistoryTokens
	// the part of it that earlier turns of the session take.
	EstimatedPromptTokens int
	HistoryTokens         int
	Ms                    int64
}

// RetrieveInput asks for the top candidates from a knowledge base.
type RetrieveInput struct {
	RequestID string
	// KB is the kb's key (kbref.Ref.Key), its owner's and its name.
	KB    string
	Query string
	K     int
}

// ChunkRef names a chunk of a knowledge-base version with its score.
// Stages pass refs, not chunk text, so that workflow histories stay small
// (the text is in every worker's copy of the kb).
type ChunkRef struct {
	ID    string
	Score float64
}

// RetrieveOutput carries the candidates.
type RetrieveOutput struct {
	KBVersion int64
	Hits      []ChunkRef
	CacheHit  bool
	Ms        int64
}

// RerankInput asks to order candidates and keep the best K.
type RerankInput struct {
	RequestID string
	// KB is the kb's key (kbref.Ref.Key), its owner's and its name.
	KB        string
	KBVersion int64
	Query     string
	Hits      []ChunkRef
	K         int
}

// RerankOutput carries the kept chunks, best first.
type RerankOutput struct {
	Hits []ChunkRef
	Ms   int64
}

// LLMInput is one streamed completion.
type LLMInput struct {
	RequestID string
	Pool      string
	Query     string
	// KB is the kb's key (kbref.Ref.Key), its owner's and its name.
	KB        string
	KBVersion int64
	Context   []ChunkRef
	MaxTokens int
	// Done, if set, is what the workflow knows of the request's end: the
	// stream builds the done event from it and writes it itself.
	Done *DoneFacts
	// Session, if set: the prompt carries the session's earlier turns and
	// the answer is recorded in it before the done event is written, so
	// that a follow-up sent the moment the client sees done finds it.
	Session *SessionRef
	// CacheAnswer keeps a complete answer in the L3 tier.
	CacheAnswer bool
	// Conversation, if set, is the client's own conversation (OpenAI's
	// messages), which the prompt carries whole after the context's
	// system message; Query is then its last user message, what was
	// retrieved for. Gateway: no context, the conversation is the prompt
	// as it came.
	Conversation []openai.Message `json:",omitempty"`
	Gateway      bool             `json:",omitempty"`
	// Sampling is forwarded to the backend as it came; Choices is how
	// many answers the client asked for (OpenAI's n; 0 is one).
	Sampling *openai.Sampling `json:",omitempty"`
	Choices  int              `json:",omitempty"`
	// Model, if set, is asked of the pool's endpoints in place of the
	// pool's own model: a fallback to another model on the same servers.
	Model string `json:",omitempty"`
	// FallBack: the request has a fallback left, so that a failure one
	// may answer before the first token (every circuit open, the prompt
	// beyond the model's context, the first token late on the last
	// attempt) ends the activity with ErrTypeFallback instead of failing
	// the request.
	FallBack bool `json:",omitempty"`
	// ServiceTier is the request's service class (request.Classes; ""
	// is the default class): a pool whose backend takes a priority is
	// sent the class's.
	ServiceTier string `json:",omitempty"`
	// Weight and MaxConcurrent are its tier's, as its admission had them:
	// a stream paused for a more urgent request queues again with them.
	Weight        int `json:",omitempty"`
	MaxConcurrent int `json:",omitempty"`
}

// LLMOutput summarises the stream.
type LLMOutput struct {
	Usage        events.Usage
	FinishReason string
	// Sources are the documents whose chunks were in the prompt; ContextShed
	// counts chunks dropped so the prompt fit the pool.
	Sources      []string
	ContextShed  int
	FirstTokenMs int64
	Ms           int64
	// DoneWritten reports that the done event is already in the stream;
	// TurnRecorded that the answer is already in the session.
	DoneWritten  bool
	TurnRecorded bool
	// Model is the model that answered (llm.Result.Model, or the pool's
	// configured model when the backend named none).
	Model string `json:",omitempty"`
	// FinishReasons are every choice's when several were asked for.
	FinishReasons []string `json:",omitempty"`
	// Failovers are the answer's moves to another endpoint mid-stream,
	// so that the history shows where and why an answer changed hands.
	Failovers []StreamFailover `json:",omitempty"`
	// Pauses is how often the stream was paused for a more urgent
	// request (admission.preemption) and continued.
	Pauses int `json:",omitempty"`
}

// StreamFailover is one move of an answer to another endpoint of its
// pool mid-stream (llm.Failover).
type StreamFailover struct {
	// From is the endpoint that failed, To the one asked to continue
	// ("" when none had its circuit closed); both by EndpointName.
	From, To string
	// AfterTokens is how many tokens the client had when From failed.
	AfterTokens int
	// Reason is why From's stream ended (token_idle, http_<status>,
	// broken); Outcome is resumed, failed or no_endpoint.
	Reason, Outcome string
	// GapMs is the client's wait for the continuation's first token.
	GapMs int64
	// PromptTokens is the continuation's prompt (the conversation and the
	// prefix again): the gateway's cost, not billed to the client.
	PromptTokens int `json:",omitempty"`
}

// LookupAnswerInput asks the L3 tier for an answer to the query and, on a
// hit, to stream it to the client.
type LookupAnswerInput struct {
	RequestID string
	Query     string
	// KB is the kb's key (kbref.Ref.Key), its owner's and its name.
	KB        string
	MaxTokens int
	// Pool and PromptBound are the route and the prompt's bound before
	// retrieval as the door computed them (ChatInput.Pool, PromptBound);
	// the lookup counts them itself only when they are empty.
	Pool        string `json:",omitempty"`
	PromptBound int    `json:",omitempty"`
	// Done is what the workflow knows of the request's end; a hit builds
	// the done event from it and writes it.
	Done *DoneFacts
}

// LookupAnswerOutput says whether the request was answered from the cache.
type LookupAnswerOutput struct {
	Hit bool
	// PromptBound is the prompt's upper bound before retrieval it routed
	// by (without session history), for admission to route by on a miss
	// instead of counting the query's tokens again.
	PromptBound  int
	KBVersion    int64
	FinishReason string
	Sources      []string
	ContextShed  int
	Ms           int64
	// CachedTokens are the hit's completion tokens, served without a
	// model call (the usage ledger's cached tokens).
	CachedTokens int `json:",omitempty"`
}

// FinalizeInput ends a request: give back its permit or queue place and
// write its terminal event.
type FinalizeInput struct {
	RequestID string
	// Pool is the pool admission used; empty with AllPools when admission
	// began but its answer never came back (it may still have taken a
	// permit or place somewhere), and empty alone when it never ran.
	Pool     string
	AllPools bool
	// EventType is events.TypeDone, TypeRejected or TypeError; empty when
	// the terminal event was already written (by the stream).
	EventType string
	// Done and Answer make the done event of an answer whose activity did
	// not write it (doneEvent); Failure is a rejected or error event's.
	Done    *DoneFacts
	Answer  *Answer
	Failure *events.Failure
	// StopStream sets the cancel flag first, so that an LLM stream still
	// running stops before its permit is given away.
	StopStream bool
	// Used is what the request consumed, for the rate-limit refund of the
	// rest of its Reservation (limiter.Decision.Reservation); nil when
	// unknown (nothing is refunded).
	Used        *Used
	Reservation string
	// Budget, if set, settles the request's monthly budget charge.
	Budget *BudgetSettle `json:",omitempty"`
	// Turn, if set, records the request in its session (idempotently).
	Turn *TurnInput
	// Report, if set, is what the request's metrics record.
	Report *Report
}

// Report is a finished request as metrics and its log line see it: no
// text of the prompt or answer.
type Report struct {
	// Route is the pool, request.RouteCache, or empty before routing.
	Route   string
	Outcome string
	Reason  string
	Timings []events.StageTiming
	// Tier is the caller's tier and Usage the LLM call's tokens.
	Tier  string       `json:",omitempty"`
	Usage events.Usage `json:",omitzero"`
	// Tenant is for the request's log line and the per-tenant service
	// counters, whose tenant label is bounded (metrics.TrackTenants).
	Tenant string `json:",omitempty"`
	// ServiceTier is the service class the request was served in.
	ServiceTier string `json:",omitempty"`
}

// TurnInput is a request as its session remembers it. The answer of a done
// request is read back from its event stream: it is what the client got.
type TurnInput struct {
	Session SessionRef
	Query   string
	// Outcome is a session outcome (request.OutcomeDone, ...).
	Outcome string
	Reason  string
}

// BudgetSettle replaces a budget reservation (budget.Decision.Reservation)
// with what the request used: the tokens the usage ledger records for it,
// priced at the pool and model the ledger records (budget.Use), so that a
// counter rebuilt from the ledger agrees with one settled.
type BudgetSettle struct {
	Reservation      string
	PromptTokens     int
	CompletionTokens int
	// Pool and Model are where the request was answered; empty from a
	// workflow that does not say (it settles at the reserved price).
	Pool  string `json:",omitempty"`
	Model string `json:",omitempty"`
}

// Used is what a request consumed against its rate-limit reservation.
type Used struct {
	Tokens   int
	Requests int
}

// StopStreamInput asks a running LLM stream to stop.
type StopStreamInput struct {
	RequestID string
}

// BackendUnavailable is the detail of an ErrTypeBackendUnavailable error.
type BackendUnavailable struct {
	// RetryAfter is the time until the first circuit of the pool
	// half-opens and lets a probe through.
	RetryAfter time.Duration
}

// Fallen is the detail of an ErrTypeFallback error: why the pool could
// not answer (request.ReasonBackendUnavailable,
// request.FallbackContextTooLong, request.FallbackFirstTokenTimeout),
// and the model it was asked for.
type Fallen struct {
	Reason string
	Model  string
}

// streamProgress is the LLM activity's heartbeat detail.
type streamProgress struct {
	Tokens int
}
