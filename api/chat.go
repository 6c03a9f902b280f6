package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/oklog/ulid/v2"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/workflows"
)

// chatRequest is the body of POST /v1/chat.
type chatRequest struct {
	Query     string `json:"query"`
	KB        string `json:"kb"`
	SessionID string `json:"session_id"`
	MaxTokens *int   `json:"max_tokens"`

	// queryTokens is the query's token count once counted (see
	// Server.queryTokens); 0 until then.
	queryTokens int
	counted     bool
}

var sessionIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// validate normalises and checks a chat request.
func (s *Server) validate(req *chatRequest) error {
	req.Query = strings.TrimSpace(req.Query)
	if req.Query == "" {
		return badRequest("empty_query", "query must not be empty")
	}
	if !utf8.ValidString(req.Query) {
		return badRequest("bad_query", "query must be valid UTF-8")
	}
	if n := utf8.RuneCountInString(req.Query); n > s.cfg.API.MaxQueryChars {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "query_too_long",
			Message: fmt.Sprintf("query has %d characters; the limit is %d", n, s.cfg.API.MaxQueryChars)}
	}
	if req.KB == "" {
		req.KB = s.cfg.Retrieval.DefaultKB
	}
	if req.SessionID != "" && !sessionIDPattern.MatchString(req.SessionID) {
		return badRequest("bad_session_id", "session_id must be 1-128 characters of letters, digits and ._:-")
	}
	if req.MaxTokens == nil {
		n := s.cfg.API.DefaultMaxTokens
		req.MaxTokens = &n
	}
	if *req.MaxTokens < 1 || *req.MaxTokens > s.cfg.API.MaxTokensLimit {
		return badRequest("bad_max_tokens", "max_tokens must be between 1 and %d", s.cfg.API.MaxTokensLimit)
	}
	// The query alone must fit the long pool, whatever context is shed.
	// A token is at least one byte, so a query of few bytes cannot be too
	// long and is not counted here (a tiktoken encode is most of what a
	// refused request costs).
	limit := s.cfg.Pools.Long.MaxPromptTokens
	if s.prompts.BoundForQueryTokens(len(req.Query), 0, 0) <= limit {
		return nil
	}
	if bare := s.prompts.BoundForQueryTokens(s.queryTokens(req), 0, 0); bare > limit {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "query_too_long",
			Message: fmt.Sprintf("the query needs %d prompt tokens; the limit is %d", bare, limit)}
	}
	return nil
}

// queryTokens counts the query's tokens once per request.
func (s *Server) queryTokens(req *chatRequest) int {
	if !req.counted {
		req.queryTokens, req.counted = s.prompts.QueryTokens(req.Query), true
	}
	return req.queryTokens
}

func newRequestID() string { return "chat-" + ulid.Make().String() }

var requestIDPattern = regexp.MustCompile(`^chat-[0-9A-HJKMNP-TV-Z]{26}$`)

func (s *Server) postChat(c echo.Context) error {
	who, err := s.authenticate(c)
	if err != nil {
		return err
	}
	var req chatRequest
	if err := s.decodeJSON(c, &req); err != nil {
		return err
	}
	if err := s.validate(&req); err != nil {
		return err
	}
	id, sub, err := s.beginChat(c, who, &req)
	if err != nil {
		return err
	}
	defer sub.Close()
	return s.stream(c, sub, id)
}

// beginChat takes a validated request through the door and starts its
// workflow: kb check, routing, rate limits, start slot, queue depth, event
// subscription, accepted event, workflow start. It returns the request's
// id and a subscription to its events from the first, which the caller
// must close; once it returns, the workflow runs and the caller renders
// its events. On error nothing was started and every charge was given
// back.
func (s *Server) beginChat(c echo.Context, who caller, req *chatRequest) (string, *events.Subscription, error) {
	ctx := c.Request().Context()
	if err := s.checkKB(ctx, req.KB); err != nil {
		return "", nil, err
	}
	live := s.policy.Current()
	tier, _ := live.Tier(who.Tier)
	if tier.MaxOutputTokens > 0 && *req.MaxTokens > tier.MaxOutputTokens {
		// The tier's cap, not the caller's wish, bounds the answer.
		*req.MaxTokens = tier.MaxOutputTokens
	}
	d := door{id: newRequestID(), who: who, tier: tier, pool: s.route(ctx, who, req)}
	var err error
	d.reservation, err = s.reserve(c, d.id, who, tier, live.Limits.Enabled, s.cost(live, d, req))
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests {
			s.metrics.Refused(metrics.OutcomeRejectedRate)
		}
		return "", nil, err
	}
	release, err := s.takeStartSlot()
	if err != nil {
		s.refuse(ctx, d, req, err)
		return "", nil, err
	}
	defer release()
	if err := s.checkQueue(ctx, d.pool, who.Tenant, tier); err != nil {
		s.refuse(ctx, d, req, err)
		return "", nil, err
	}
	sub, err := s.open(ctx, d, req)
	if err != nil {
		return "", nil, err
	}
	err = s.startChat(ctx, d, *req)
	release()
	if err != nil {
		s.logger.Error("start chat workflow", "requestID", d.id, "err", err)
		sub.Close()
		_ = s.events.Delete(context.WithoutCancel(ctx), d.id)
		s.refundAll(ctx, d.id, d.reservation)
		return "", nil, unavailable("could not start the request; please retry")
	}
	return d.id, sub, nil
}

// door is what the door decided about one request on its way in.
type door struct {
	id   string
	who  caller
	tier config.Tier
	// pool is the request's route; admission queues it there.
	pool string
	// reservation is its rate-limit charge ("" when none applied).
	reservation string
}

// checkKB refuses a request for a knowledge base that does not exist.
func (s *Server) checkKB(ctx context.Context, kb string) error {
	known, err := s.kbKnown(ctx, kb)
	switch {
	case err != nil:
		s.logger.Error("look up kb", "kb", kb, "err", err)
		return unavailable("knowledge bases unavailable; please retry")
	case !known:
		return badRequest("unknown_kb", "unknown knowledge base %q", kb)
	}
	return nil
}

// route picks the request's pool by the rule and inputs admission uses:
// the prompt's bound before retrieval and the tokens of the session turns
// it will carry. The workflow is started with this pool, so the queue the
// door checks is the queue the request joins. A session that cannot be
// read is asked without its history, as the stream would.
func (s *Server) route(ctx context.Context, who caller, req *chatRequest) string {
	history := 0
	if req.SessionID != "" && s.sessions != nil {
		var err error
		_, history, err = s.sessions.History(ctx, s.prompts, who.Tenant, req.SessionID, s.cfg.Sessions.HistoryTokens)
		if err != nil {
			s.logger.Warn("read session to route; routing without its history", "session", req.SessionID, "err", err)
		}
	}
	return request.Route(s.promptBound(req), history, s.cfg.Routing.ShortThresholdTokens)
}

// promptBound is the prompt's upper bound before retrieval: the query and
// top_k full chunks.
func (s *Server) promptBound(req *chatRequest) int {
	return s.prompts.BoundForQueryTokens(s.queryTokens(req), s.cfg.Retrieval.TopK, s.cfg.Retrieval.ChunkTokens)
}

// cost is what the rate limits charge a request up front: the prompt with
// a full context, the whole session budget and every output token it may
// produce. The workflow refunds what it did not use when it ends. Only
// limits that count tokens need a cost; a flood refused on requests per
// minute never pays for tokenization.
func (s *Server) cost(live *policy.Policy, d door, req *chatRequest) int {
	if !live.Limits.Enabled || !ratesOf(d.tier).CountsTokens() {
		return 0
	}
	cost := s.promptBound(req) + *req.MaxTokens
	if req.SessionID != "" {
		cost += s.cfg.Sessions.HistoryTokens
	}
	// While the healer throttles long requests, a request routed long must
	// find factor times its tokens in its buckets: a tenant's long
	// requests hit 429 sooner, short ones are unaffected. The refund still
	// gives back the unused part, so the factor bounds how many long
	// requests a tenant starts at once, not what it pays.
	if f := live.ChargeFactor(d.pool); f > 1 {
		cost = int(math.Ceil(float64(cost) * f))
	}
	return cost
}

// takeStartSlot takes a slot for a workflow start, to hold until the
// start returns: a flood beyond what Temporal can start is answered at
// once instead of queueing up in this process. release may be called more
// than once.
func (s *Server) takeStartSlot() (release func(), err error) {
	select {
	case s.starts <- struct{}{}:
	default:
		return nil, &apiError{Status: http.StatusServiceUnavailable, Code: request.ReasonBusy, RetryAfter: 1,
			Message: "Too many requests are starting right now. Please retry in a moment."}
	}
	var once sync.Once
	return func() { once.Do(func() { <-s.starts }) }, nil
}

// refuse gives back a request's whole charge when the door turns it away
// for want of capacity, records the refusal in its session and counts it.
func (s *Server) refuse(ctx context.Context, d door, req *chatRequest, err error) {
	s.refundAll(ctx, d.id, d.reservation)
	var ae *apiError
	if errors.As(err, &ae) {
		s.recordRefusal(ctx, d.who, *req, d.id, ae.Code)
		s.metrics.Refused(metrics.OutcomeOf(request.OutcomeRejected, ae.Code))
	}
}

// open subscribes to the request's events and writes its accepted event.
// Subscribing first means the events the workflow writes while its start
// call is still returning are already buffered for the client; the
// accepted event is the stream's first entry whatever the workflow writes.
func (s *Server) open(ctx context.Context, d door, req *chatRequest) (*events.Subscription, error) {
	sub, err := s.hub.Subscribe(ctx, d.id, "0")
	if err != nil {
		s.logger.Error("subscribe to events", "requestID", d.id, "err", err)
		s.refundAll(ctx, d.id, d.reservation)
		return nil, unavailable("event stream unavailable")
	}
	if _, err := s.events.Append(ctx, d.id, events.TypeAccepted, events.Accepted{RequestID: d.id, Tenant: d.who.Tenant, KB: req.KB}); err != nil {
		s.logger.Error("write accepted event", "requestID", d.id, "err", err)
		sub.Close()
		s.refundAll(ctx, d.id, d.reservation)
		return nil, unavailable("event store unavailable")
	}
	return sub, nil
}

// recordRefusal records a request the door turned away for want of
// capacity in its session, as the workflow does with a request its queue
// turned away: the session's next turn then knows its question went
// unanswered. Refusals by the rate limits are not recorded: a flood must
// cost one Redis call per request, and its Retry-After already says when.
func (s *Server) recordRefusal(ctx context.Context, who caller, req chatRequest, id, reason string) {
	if s.sessions == nil || req.SessionID == "" {
		return
	}
	err := s.sessions.Append(ctx, who.Tenant, req.SessionID, session.Turn{
		RequestID: id, Query: req.Query, Outcome: request.OutcomeRejected, Reason: reason, At: time.Now().UTC(),
	})
	if err != nil {
		s.logger.Warn("record refusal in session", "requestID", id, "session", req.SessionID, "err", err)
	}
}

// checkQueue refuses a request whose pool queue, or whose tenant's share
// of it, is full: 503 with Retry-After at once, instead of a workflow
// started only to be turned away (the dev server starts only tens of
// workflows a second). The admission script enforces the same caps
// atomically; this read only spares Temporal the flood.
func (s *Server) checkQueue(ctx context.Context, pool, tenant string, tier config.Tier) error {
	total, mine, err := s.gate.Depth(ctx, pool, tenant)
	if err != nil {
		s.logger.Warn("read queue depth", "pool", pool, "err", err)
		return nil // the admission script still enforces the caps
	}
	retry := max(1, int(s.cfg.Admission.RecheckInterval.Seconds()))
	if total >= s.cfg.Admission.MaxQueueDepth {
		return &apiError{Status: http.StatusServiceUnavailable, Code: request.ReasonQueueFull, RetryAfter: retry,
			Message: "The service is at capacity and its queue is full. Please retry shortly."}
	}
	if tier.MaxQueuePerTenant > 0 && mine >= tier.MaxQueuePerTenant {
		return &apiError{Status: http.StatusServiceUnavailable, Code: request.ReasonTenantQueueFull, RetryAfter: retry,
			Message: "Your organisation already has as many requests waiting as its plan allows. Please retry when some have finished."}
	}
	return nil
}

// startChat starts the request's workflow with the settings of its tier.
func (s *Server) startChat(ctx context.Context, d door, req chatRequest) error {
	cfg := s.cfg
	in := workflows.ChatInput{
		RequestID: d.id, Tenant: d.who.Tenant, User: d.who.User, Tier: d.who.Tier,
		Query: req.Query, KB: req.KB, SessionID: req.SessionID, MaxTokens: *req.MaxTokens,
		Pool: d.pool, RateReservation: d.reservation, Settings: workflows.ChatSettingsFor(cfg, d.tier),
	}
	// An answer that depends on a conversation is that conversation's
	// own: requests in a session neither read nor fill the answer cache.
	in.Settings.AnswerCache = s.answerKBs[req.KB] && req.SessionID == ""
	// No workflow execution timeout: every wait inside the workflow is
	// bounded (max_wait, LLM timeouts and attempts, local activity
	// deadlines), and a timeout would cost the server a timer per request.
	opts := client.StartWorkflowOptions{
		ID:                    workflows.ChatWorkflowID(d.id),
		TaskQueue:             cfg.Temporal.TaskQueue,
		EnableEagerStart:      cfg.Temporal.EagerStart,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	}
	if cfg.Temporal.SearchAttributes {
		opts.TypedSearchAttributes = temporal.NewSearchAttributes(workflows.SearchTenant.ValueSet(d.who.Tenant))
	}
	// Not the request's context: a client that leaves mid-call must not
	// leave a started workflow we believe failed. If it left, streaming
	// notices at once and detaches.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := s.temporal.ExecuteWorkflow(sctx, opts, workflows.ChatWorkflowName, in)
	return err
}
