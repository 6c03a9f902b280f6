package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/oklog/ulid/v2"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/metrics"
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

// caller is who sent a request.
type caller struct {
	Tenant, User, Tier string
}

func (s *Server) authenticate(c echo.Context) (caller, error) {
	key := c.Request().Header.Get("X-API-Key")
	if auth := c.Request().Header.Get("Authorization"); key == "" && auth != "" {
		scheme, token, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			return caller{}, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "Authorization must be 'Bearer <api key>'"}
		}
		key = token
	}
	if key == "" {
		if s.cfg.Auth.AllowAnonymous {
			// Anonymous callers share one tenant; the per-IP limits are
			// what tell them apart.
			return caller{Tenant: "anonymous", Tier: s.policy.Current().Limits.DefaultTier}, nil
		}
		return caller{}, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "an API key is required (Authorization: Bearer <key>)"}
	}
	k, ok := s.keys[key]
	if !ok {
		return caller{}, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "unknown API key"}
	}
	who := caller{Tenant: k.Tenant, User: k.User, Tier: k.Tier}
	if who.User == "" {
		who.User = k.Tenant
	}
	if who.Tier == "" {
		who.Tier = s.policy.Current().Limits.DefaultTier
	}
	return who, nil
}

// decodeJSON reads a size-limited JSON object with no unknown fields and
// nothing after it.
func (s *Server) decodeJSON(c echo.Context, dst any) error {
	return s.decodeJSONLimit(c, dst, s.cfg.API.MaxBodyBytes)
}

// decodeJSONLimit is decodeJSON with a body limit of its own.
func (s *Server) decodeJSONLimit(c echo.Context, dst any, limit int64) error {
	body, err := readJSONBody(c, limit)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return badRequest("bad_json", "malformed JSON: %v", err)
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return badRequest("bad_json", "unexpected data after the JSON object")
	}
	return nil
}

// readJSONBody reads a non-empty, size-limited body sent as JSON.
func readJSONBody(c echo.Context, limit int64) ([]byte, error) {
	if ct := c.Request().Header.Get(echo.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != echo.MIMEApplicationJSON {
			return nil, &apiError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type", Message: "Content-Type must be application/json"}
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), c.Request().Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
				Message: fmt.Sprintf("request body exceeds %d bytes", limit)}
		}
		return nil, badRequest("bad_body", "read request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest("bad_json", "request body must be a JSON object")
	}
	return body, nil
}

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
// workflow: kb check, rate limits, start slot, queue depth, event
// subscription, accepted event, workflow start. It returns the request's
// id and a subscription to its events from the first, which the caller
// must close; once it returns, the workflow runs and the caller renders
// its events. On error nothing was started and every charge was given
// back.
func (s *Server) beginChat(c echo.Context, who caller, req *chatRequest) (string, *events.Subscription, error) {
	switch known, err := s.kbKnown(c.Request().Context(), req.KB); {
	case err != nil:
		s.logger.Error("look up kb", "kb", req.KB, "err", err)
		return "", nil, unavailable("knowledge bases unavailable; please retry")
	case !known:
		return "", nil, badRequest("unknown_kb", "unknown knowledge base %q", req.KB)
	}
	live := s.policy.Current()
	tier, _ := live.Tier(who.Tier)
	if tier.MaxOutputTokens > 0 && *req.MaxTokens > tier.MaxOutputTokens {
		// The tier's cap, not the caller's wish, bounds the answer.
		*req.MaxTokens = tier.MaxOutputTokens
	}
	ctx := c.Request().Context()
	id := newRequestID()
	log := s.logger.With("requestID", id, "tenant", who.Tenant)

	// The rate limits come first: a flood is refused here with one Redis
	// call, before it takes a start slot or looks at the queue. Charged at
	// the upper bound: the prompt with a full context plus every output
	// token it may produce; the workflow refunds what it did not use when
	// it ends, and every refusal below gives the whole charge back.
	// Only limits that count tokens need the query counted: a flood
	// refused on requests per minute never pays for tokenization.
	bound := func() int {
		return s.prompts.BoundForQueryTokens(s.queryTokens(req), s.cfg.Retrieval.TopK, s.cfg.Retrieval.ChunkTokens)
	}
	cost := 0
	if live.Limits.Enabled && ratesOf(tier).CountsTokens() {
		cost = bound() + *req.MaxTokens
		if req.SessionID != "" {
			// The session's turns may fill their budget.
			cost += s.cfg.Sessions.HistoryTokens
		}
		// While the healer throttles long requests (their prompts hold a
		// batch's KV cache longest, the tail seed 002 is about), a request
		// routed long must find factor times its tokens in its buckets: a
		// tenant's long requests hit 429 sooner, short ones are unaffected.
		// The workflow still refunds the unused part when it ends, so the
		// factor bounds how many long requests a tenant starts at once,
		// not what it pays for the tokens it used.
		if f := live.ChargeFactor(activities.Route(bound(), s.cfg.Routing.ShortThresholdTokens)); f > 1 {
			cost = int(math.Ceil(float64(cost) * f))
		}
	}
	reservation, err := s.reserve(c, id, who, tier, live.Limits.Enabled, cost)
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests {
			s.metrics.Refused(metrics.OutcomeRejectedRate)
		}
		return "", nil, err
	}
	// A slot for the workflow start, held until the start returns: a
	// flood beyond what Temporal can start is answered at once instead of
	// queueing up in this process.
	select {
	case s.starts <- struct{}{}:
	default:
		s.refundAll(ctx, id, reservation)
		s.recordRefusal(ctx, who, *req, id, "busy")
		s.metrics.Refused(metrics.OutcomeOf(workflows.OutcomeRejected, "busy"))
		return "", nil, &apiError{Status: http.StatusServiceUnavailable, Code: "busy", RetryAfter: 1,
			Message: "Too many requests are starting right now. Please retry in a moment."}
	}
	started := false
	releaseSlot := func() {
		if !started {
			started = true
			<-s.starts
		}
	}
	defer releaseSlot()
	if err := s.checkQueue(ctx, activities.Route(bound(), s.cfg.Routing.ShortThresholdTokens), who.Tenant, tier); err != nil {
		s.refundAll(ctx, id, reservation)
		var ae *apiError
		if errors.As(err, &ae) {
			s.recordRefusal(ctx, who, *req, id, ae.Code)
			s.metrics.Refused(metrics.OutcomeOf(workflows.OutcomeRejected, ae.Code))
		}
		return "", nil, err
	}

	// Subscribing first means the events the workflow writes while its
	// start call is still returning are already buffered for the client.
	sub, err := s.hub.Subscribe(ctx, id, "0")
	if err != nil {
		log.Error("subscribe to events", "err", err)
		s.refundAll(ctx, id, reservation)
		return "", nil, unavailable("event stream unavailable")
	}
	// The accepted event goes first so that it is the stream's first entry
	// whatever the workflow writes.
	if _, err := s.events.Append(ctx, id, events.TypeAccepted, events.Accepted{RequestID: id, Tenant: who.Tenant, KB: req.KB}); err != nil {
		log.Error("write accepted event", "err", err)
		sub.Close()
		s.refundAll(ctx, id, reservation)
		return "", nil, unavailable("event store unavailable")
	}
	err = s.startChat(ctx, id, who, tier, *req, reservation)
	releaseSlot()
	if err != nil {
		log.Error("start chat workflow", "err", err)
		sub.Close()
		_ = s.events.Delete(context.WithoutCancel(ctx), id)
		s.refundAll(ctx, id, reservation)
		return "", nil, unavailable("could not start the request; please retry")
	}
	return id, sub, nil
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
		RequestID: id, Query: req.Query, Outcome: session.OutcomeRejected, Reason: reason, At: time.Now().UTC(),
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
		return &apiError{Status: http.StatusServiceUnavailable, Code: workflows.ReasonQueueFull, RetryAfter: retry,
			Message: "The service is at capacity and its queue is full. Please retry shortly."}
	}
	if tier.MaxQueuePerTenant > 0 && mine >= tier.MaxQueuePerTenant {
		return &apiError{Status: http.StatusServiceUnavailable, Code: workflows.ReasonTenantQueueFull, RetryAfter: retry,
			Message: "Your organisation already has as many requests waiting as its plan allows. Please retry when some have finished."}
	}
	return nil
}

// ChatSettings is what a request of tier runs with under cfg: copied into
// its workflow input, so that a later config change never alters it.
func ChatSettings(cfg config.Config, tier config.Tier) workflows.ChatSettings {
	maxWait := cfg.Admission.MaxWait
	var byPool map[string]time.Duration
	if tier.MaxWait > 0 {
		maxWait = tier.MaxWait
	} else {
		for name, p := range map[string]config.Pool{activities.PoolShort: cfg.Pools.Short, activities.PoolLong: cfg.Pools.Long} {
			if p.MaxWait > 0 {
				if byPool == nil {
					byPool = map[string]time.Duration{}
				}
				byPool[name] = p.MaxWait
			}
		}
	}
	return workflows.ChatSettings{
		MaxWait:            maxWait,
		MaxWaitByPool:      byPool,
		RecheckInterval:    cfg.Admission.RecheckInterval,
		MaxRecheckInterval: cfg.Admission.MaxRecheckInterval,
		FastWait:           cfg.Admission.FastWait,
		DisconnectGrace:    cfg.API.DisconnectGrace,
		TopK:               cfg.Retrieval.TopK,
		Candidates:         cfg.Retrieval.Candidates,
		LLMTimeout:         cfg.LLM.Timeout,
		LLMHeartbeat:       cfg.LLM.HeartbeatTimeout,
		LLMMaxAttempts:     cfg.LLM.MaxAttempts,
		SearchAttributes:   cfg.Temporal.SearchAttributes,
		Weight:             tier.Weight,
		MaxPerTenant:       tier.MaxQueuePerTenant,
		HistoryTokens:      cfg.Sessions.HistoryTokens,
	}
}

func (s *Server) startChat(ctx context.Context, id string, who caller, tier config.Tier, req chatRequest, reservation string) error {
	cfg := s.cfg
	in := workflows.ChatInput{
		RequestID: id, Tenant: who.Tenant, User: who.User, Tier: who.Tier,
		Query: req.Query, KB: req.KB, SessionID: req.SessionID, MaxTokens: *req.MaxTokens,
		RateReservation: reservation, Settings: ChatSettings(cfg, tier),
	}
	// An answer that depends on a conversation is that conversation's
	// own: requests in a session neither read nor fill the answer cache.
	in.Settings.AnswerCache = s.answerKBs[req.KB] && req.SessionID == ""
	// No workflow execution timeout: every wait inside the workflow is
	// bounded (max_wait, LLM timeouts and attempts, local activity
	// deadlines), and a timeout would cost the server a timer per request.
	opts := client.StartWorkflowOptions{
		ID:                    workflows.ChatWorkflowID(id),
		TaskQueue:             cfg.Temporal.TaskQueue,
		EnableEagerStart:      cfg.Temporal.EagerStart,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	}
	if cfg.Temporal.SearchAttributes {
		opts.TypedSearchAttributes = temporal.NewSearchAttributes(workflows.SearchTenant.ValueSet(who.Tenant))
	}
	// Not the request's context: a client that leaves mid-call must not
	// leave a started workflow we believe failed. If it left, streaming
	// notices at once and detaches.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := s.temporal.ExecuteWorkflow(sctx, opts, workflows.ChatWorkflowName, in)
	return err
}
