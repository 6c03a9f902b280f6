// Package workflows holds Sluice's Temporal workflows. Code here must stay
// deterministic: no wall clock, no goroutines, no I/O, no map iteration
// order; every side effect is an activity.
package workflows

import (
	"encoding/json"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Names shared by the workflow, its callers and its activities.
const (
	ChatWorkflowName = "ChatWorkflow"

	// SignalCancel ends a request at any stage (payload CancelSignal).
	SignalCancel = "cancel"
	// SignalAdmitted tells a queued request that it now holds a permit
	// (payload AdmittedSignal). Sent by whoever released the permit.
	SignalAdmitted = "admitted"
	// SignalDetach says a client stream closed; with no client attached for
	// ChatSettings.DisconnectGrace the request cancels itself.
	SignalDetach = "detach"
	// SignalAttach says a client (re)attached to the request's stream.
	SignalAttach = "attach"
	// SignalRecheck asks a queued request to look at its place in the
	// queue once (payload RecheckSignal): sent to every running request
	// when Redis lost the queue (it restarted empty), so that waiters
	// come back at their old places instead of waiting for their deadline.
	SignalRecheck = "recheck"
	// QueryStatus returns Status.
	QueryStatus = "status"
)

// Search attributes Sluice upserts so requests can be found in the
// Temporal UI (e.g. SluiceTenant="acme" AND SluiceOutcome="rejected").
// The server must have them registered as Keyword.
var (
	SearchTenant  = temporal.NewSearchAttributeKeyKeyword("SluiceTenant")
	SearchRoute   = temporal.NewSearchAttributeKeyKeyword("SluiceRoute")
	SearchOutcome = temporal.NewSearchAttributeKeyKeyword("SluiceOutcome")
)

// SearchAttributeNames lists the custom search attributes to register.
var SearchAttributeNames = []string{"SluiceTenant", "SluiceRoute", "SluiceOutcome"}

// ChatWorkflowID is the workflow ID of a chat request. Request IDs are
// already unique and prefixed ("chat-<ulid>"), so the ID is the request ID;
// keeping it behind this function means no caller builds it by hand.
func ChatWorkflowID(requestID string) string { return requestID }

// RequestIDOf is the request of a chat workflow ID, ChatWorkflowID's
// inverse.
func RequestIDOf(workflowID string) string { return workflowID }

// ChatInput starts one chat request.
type ChatInput struct {
	RequestID string
	Tenant    string
	User      string
	// KeyID names the caller's key as logs do (door.Caller.KeyID), for
	// the usage ledger; empty for anonymous callers.
	KeyID string `json:",omitempty"`
	Tier  string
	Query string
	// KB is the kb's name as the client gave it; KBTenant the tenant whose
	// own kb it is, as the door resolved it, or "" for a shared kb. Stages
	// know the kb by KBRef's key.
	KB        string
	KBTenant  string
	SessionID string
	MaxTokens int
	// Pool is the route the door picked (request.Route on the prompt's
	// bound and the session turns it will carry); admission queues the
	// request there. Empty: admission routes.
	Pool string
	// PromptBound is the prompt's upper bound before retrieval (without
	// session turns) as the door counted it to route: the answer-cache
	// lookup keys by its pool and admission routes by it instead of
	// counting again. 0: they count it.
	PromptBound int `json:",omitempty"`
	// RateReservation is the request's rate-limit charge (from
	// limiter.Reserve), refunded in part when it ends; empty when no
	// limit applied.
	RateReservation string
	// BudgetReservation is the request's monthly budget charge (from
	// budget.Counter.Reserve), settled with what it used when it ends;
	// empty when its tier has no budget.
	BudgetReservation string `json:",omitempty"`
	// AdmissionTokens is the request's size in tokens (the prompt's bound,
	// session budget and max output tokens, as the door estimated them,
	// each output token counted admission.output_token_weight times),
	// its cost in the admission queue's token-fair order; 0 counts as one
	// typical request.
	AdmissionTokens int
	// AdmissionPlace is the place in its pool's fair order the door
	// reserved while the request waited there (admission.Gate.Reserve;
	// Tag 0: none): its first admission queues there. Histories without
	// it queue as new arrivals, as before.
	AdmissionPlace request.Place `json:",omitzero"`
	// Deadline is when the request should have its first token: its
	// arrival at the door plus its class's TTFT SLO (Settings.TTFTSLO;
	// zero: none). Its tenant's own requests are admitted earliest
	// deadline first (admission.Request.Deadline).
	Deadline time.Time `json:",omitzero"`
	// Conversation is an OpenAI client's messages, which the prompt
	// carries whole: after the context (Query is then its last user
	// message, what is retrieved for) or, in Gateway mode, alone, with no
	// embedding, answer cache, retrieval or rerank. Sampling is forwarded
	// to the backend as it came. All empty on Sluice's own API: the stages
	// a request runs are read from its input.
	Conversation []openai.Message `json:",omitempty"`
	Gateway      bool             `json:",omitempty"`
	Sampling     *openai.Sampling `json:",omitempty"`
	// Choices is how many answers the client asked for (OpenAI's n); 0
	// is one.
	Choices int `json:",omitempty"`
	// Fallback, if set, is the door's: the pool of the model the client
	// named could not take the prompt, so Pool is that pool's fallback.
	// The answer says so as it says the workflow's own fallbacks.
	Fallback *events.Fallback `json:",omitempty"`
	// ServiceTier is the service class the request is served in
	// (request.Classes), as the door resolved it from the client's
	// service_tier and its plan; the answer says it, and a backend that
	// takes a priority is sent the class's. Empty in histories from
	// before classes: the default class.
	ServiceTier string `json:",omitempty"`
	// Response, if set, is the Responses API's Response as asked (its
	// parameters, before output): the request's answer is a stored
	// response, which the workflow stores when it ends. Inputs written
	// before it existed lack it, so a running workflow never takes the
	// path it opens.
	Response json.RawMessage `json:",omitempty"`
	// Background marks a request no client waits for (a Responses API
	// background response): it runs to its end with no reader, so a
	// reader leaving (detach) or coming back (attach) changes nothing;
	// only a cancel ends it early. Absent from earlier inputs, so a
	// running workflow keeps the rule it started with.
	Background bool `json:",omitempty"`
	Settings   ChatSettings
}

// KBRef is the request's kb.
func (in ChatInput) KBRef() kbref.Ref { return kbref.Ref{Tenant: in.KBTenant, Name: in.KB} }

// ChatSettings is the part of the configuration a request runs with. It is
// copied into the input so that a config change never alters a running
// workflow's decisions (and replays stay deterministic).
type ChatSettings struct {
	// MaxWait bounds the admission queue wait; MaxWaitByPool replaces it
	// in the pools it names (a pool's own max_wait, when the tier set none).
	MaxWait       time.Duration
	MaxWaitByPool map[string]time.Duration
	// RecheckInterval is the Retry-After of a request refused because its
	// queue (or its tenant's share of it) is full.
	RecheckInterval time.Duration
	// FastWait is how long the admission activity of a request whose turn
	// is near waits for its grant itself (0: not at all).
	FastWait time.Duration
	// DisconnectGrace is how long a request with no attached client lives
	// before cancelling itself (0: at once).
	DisconnectGrace time.Duration
	TopK            int
	Candidates      int
	// LLMTimeout bounds one streamed completion; LLMHeartbeat is its
	// heartbeat timeout; LLMMaxAttempts bounds attempts that fail before
	// the first token.
	LLMTimeout     time.Duration
	LLMHeartbeat   time.Duration
	LLMMaxAttempts int
	// SearchAttributes enables upserting route and outcome.
	SearchAttributes bool
	// Weight is the request's share in weighted fair queuing, its service
	// class's (its tier's, for a tier without classes); MaxPerTenant its
	// cap on one tenant's waiting requests per pool, MaxConcurrent on the
	// permits one tenant holds per pool (0: none).
	Weight        int
	MaxPerTenant  int
	MaxConcurrent int
	// TTFTSLO and TPOTSLO are the service class's time to first token
	// and time per output token it is meant to meet (0: none).
	TTFTSLO time.Duration `json:",omitempty"`
	TPOTSLO time.Duration `json:",omitempty"`
	// RefuseLate: the class refuses a request that can no longer get a
	// permit within TTFTSLO (policy.ClassLimits.RefuseLate); the door
	// bounded MaxWait by it. Inputs written before it existed lack it, so
	// a running workflow never takes the paths it opens.
	RefuseLate bool `json:",omitempty"`
	// HistoryTokens bounds the session turns a prompt carries (0: none).
	HistoryTokens int
	// AnswerCache: look the answer up in the L3 tier before admission, and
	// keep a complete one there (only for allow-listed kbs, no session).
	AnswerCache bool
	// RecordUsage writes the request to the usage ledger when it ends
	// (usage.store is not off).
	RecordUsage bool `json:",omitempty"`
	// Fallbacks are each pool's fallbacks (pools.<pool>.fallbacks), in
	// the order they are tried; a pool without any is absent.
	Fallbacks map[string][]Fallback `json:",omitempty"`
}

// Fallback is one place a pool's request goes when the pool cannot
// answer it before a first token: Model on the pool's own endpoints
// (Pool empty), or pool Pool, whose model Model is.
type Fallback struct {
	Pool  string `json:",omitempty"`
	Model string
}

// CancelSignal is the payload of SignalCancel.
type CancelSignal struct {
	Reason string
}

// AdmittedSignal is the payload of SignalAdmitted.
type AdmittedSignal struct {
	Pool string
}

// RecheckSignal is the payload of SignalRecheck.
type RecheckSignal struct {
	Reason string
}

// AttachSignal is the payload of SignalAttach and SignalDetach.
type AttachSignal struct {
	Reader string
}

// ChatResult is the workflow's result.
type ChatResult struct {
	Outcome      string
	Reason       string
	Route        string
	FinishReason string
	Usage        events.Usage
	Timings      []events.StageTiming
	KBVersion    int64
	Sources      []string
	ContextShed  int
	// Fallback, if set, is the last fallback the request took.
	Fallback *events.Fallback `json:",omitempty"`
}

// Status answers QueryStatus.
type Status struct {
	Stage           string               `json:"stage"`
	Outcome         string               `json:"outcome,omitempty"`
	Reason          string               `json:"reason,omitempty"`
	Pool            string               `json:"pool,omitempty"`
	Position        int                  `json:"position,omitempty"`
	EstimatedWaitMs int64                `json:"estimated_wait_ms,omitempty"`
	Timings         []events.StageTiming `json:"timings"`
	Tenant          string               `json:"tenant"`
	KB              string               `json:"kb"`
	CancelRequested bool                 `json:"cancel_requested,omitempty"`
	// Fallbacks are the fallbacks the request took, in order.
	Fallbacks []events.Fallback `json:"fallbacks,omitempty"`
	// ServiceTier is the service class the request is served in.
	ServiceTier string `json:"service_tier,omitempty"`
}
