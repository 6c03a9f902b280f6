package api

import (
	"context"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/waitroom"
)

// beginChat takes a validated request through the door: kb check,
// routing, rate limits, queue caps, the waiting room, event subscription
// and accepted event. Then it starts the request's workflow, at once when
// a start slot is free and the pool's queue is short, or from the waiting
// room when its turn comes (startWhenAdmitted). It returns the request's
// id and a subscription to its events from the first, which the caller
// must close and render; every later outcome reaches the client as an
// event. On error nothing was started and every charge was given back.
func (s *Server) beginChat(c echo.Context, who caller, req *chatRequest, fingerprint string) (string, *events.Subscription, error) {
	ctx := c.Request().Context()
	if unanswered, _ := c.Get(redisUnansweredKey).(bool); unanswered {
		// The ban check already waited redis.request_timeout for Redis
		// in vain: its client was promised a 503 within about that, not
		// twice it.
		return "", nil, unavailable("the service's state store is not answering; please retry")
	}
	// The door's own Redis calls are bounded: with Redis stalled the
	// client hears 503 + Retry-After in about this long, not after it.
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Redis.RequestTimeout)
	defer cancel()
	key, prior, sub, err := s.replay(rctx, c, who, fingerprint)
	if err != nil || prior != "" {
		return prior, sub, err
	}
	if !req.gateway {
		if err := s.checkKB(rctx, s.resolveChatKB(who, req)); err != nil {
			return "", nil, err
		}
	}
	live := s.policy.Current()
	tier, _ := live.Tier(who.Tier)
	if tier.MaxOutputTokens > 0 && *req.MaxTokens > tier.MaxOutputTokens {
		// The tier's cap, not the caller's wish, bounds the answer.
		*req.MaxTokens = tier.MaxOutputTokens
	}
	pool, err := s.poolFor(s.route(rctx, who, req), req)
	if err != nil {
		return "", nil, err
	}
	req.pool = pool
	d := door{id: newRequestID(), who: who, tier: tier, pool: pool, arrived: time.Now()}
	d.tokens = s.tokenBound(req)
	d.reservation, err = s.reserve(rctx, c, d.id, who, tier, live.Limits.Enabled, s.cost(live, d))
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests {
			s.metrics.Refused(metrics.OutcomeRejectedRate)
			s.logRefusal(ctx, d, ae.Code)
		}
		return "", nil, err
	}
	w, err := s.enterRoom(rctx, d, live)
	if err != nil {
		s.refuse(ctx, d, req, err)
		return "", nil, err
	}
	sub, err = s.open(rctx, d, req)
	if err != nil {
		w.Leave()
		return "", nil, err
	}
	if winner, err := s.claimKey(rctx, key, d); err != nil || winner != "" {
		// A request with the same key got there first (or the key could
		// not be claimed): this one never starts.
		sub.Close()
		w.Leave()
		s.dropUnstarted(ctx, d, nil)
		if err != nil {
			return "", nil, err
		}
		sub, err := s.attach(rctx, c, winner)
		return winner, sub, err
	}
	select {
	case <-w.Admitted():
	default:
		go s.startWhenAdmitted(ctx, d, *req, w)
		return d.id, sub, nil
	}
	err = s.startChat(ctx, d, *req, 0)
	s.started(w, d, err)
	if err != nil {
		s.logger.Error("start chat workflow", "requestID", d.id, "err", err)
		sub.Close()
		s.dropUnstarted(ctx, d, key)
		return "", nil, unavailable("could not start the request; please retry")
	}
	return d.id, sub, nil
}

// dropUnstarted undoes a request that the door accepted but never started:
// its charge is given back, and its event stream deleted, or, when it held
// an idempotency key (whoever attached with the key meanwhile reads it),
// ended, with the key given back for the client's retry.
func (s *Server) dropUnstarted(ctx context.Context, d door, key *idempotency.Key) {
	if key == nil {
		_ = s.events.Delete(context.WithoutCancel(ctx), d.id)
	} else {
		s.endUnstarted(ctx, d.id)
		s.releaseKey(ctx, key, d.id)
	}
	s.refundAll(ctx, d.id, d.reservation)
}

// endUnstarted ends the stream of a request whose workflow could not be
// started.
func (s *Server) endUnstarted(ctx context.Context, id string) {
	_, _, err := s.events.AppendFinal(context.WithoutCancel(ctx), id, events.TypeError, startFailure)
	if err != nil {
		s.logger.Warn("end the stream of a request that could not be started", "requestID", id, "err", err)
	}
}

// startFailure ends a request whose workflow could not be started: the
// workflow service did not take it, which a retry may well get past.
var startFailure = events.Failure{
	Reason: request.ReasonUnavailable, Message: "The request could not be started. Please retry.", RetryAfterS: 1,
}

// door is what the door decided about one request on its way in.
type door struct {
	id   string
	who  caller
	tier config.Tier
	// pool is the request's route; admission queues it there.
	pool string
	// tokens is the most the request can take (tokenBound): its size in
	// the waiting room's and the admission queue's token-fair order.
	tokens int
	// reservation is its rate-limit charge ("" when none applied).
	reservation string
	// arrived starts the request's max wait, the door's share included.
	arrived time.Time
}

// checkKB refuses a request for a knowledge base that does not exist.
func (s *Server) checkKB(ctx context.Context, kb kbref.Ref) error {
	known, err := s.kbKnown(ctx, kb)
	switch {
	case err != nil:
		s.logger.Error("look up kb", "kb", kb, "err", err)
		return unavailable("knowledge bases unavailable; please retry")
	case !known:
		return badRequest("unknown_kb", "unknown knowledge base %q", kb.Name)
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
		_, history, err = s.sessions.History(ctx, s.prompts, who.sessionOwner(), req.SessionID, s.cfg.Sessions.HistoryTokens)
		if err != nil {
			s.logger.Warn("read session to route; routing without its history", "session", req.SessionID, "err", err)
		}
	}
	return request.Route(s.promptBound(req), history, s.cfg.Routing.ShortThresholdTokens)
}

// promptBound is the prompt's upper bound before retrieval: the query (or
// the client's conversation) and top_k full chunks; a gateway request's
// prompt is its conversation alone.
func (s *Server) promptBound(req *chatRequest) int {
	switch {
	case req.gateway:
		return req.promptTokens
	case req.conversation != nil:
		return s.prompts.BoundForQueryTokens(req.promptTokens, s.cfg.Retrieval.TopK, s.cfg.Retrieval.ChunkTokens)
	}
	return s.prompts.BoundForQueryTokens(s.queryTokens(req), s.cfg.Retrieval.TopK, s.cfg.Retrieval.ChunkTokens)
}

// tokenBound is the most tokens a request can take: the prompt with a
// full context, the whole session budget and every output token it may
// produce.
func (s *Server) tokenBound(req *chatRequest) int {
	tokens := s.promptBound(req) + max(req.choices, 1)*(*req.MaxTokens)
	if req.SessionID != "" {
		tokens += s.cfg.Sessions.HistoryTokens
	}
	return tokens
}

// cost is what the rate limits charge a request up front: its token bound
// (d.tokens). The workflow refunds what it did not use when it ends. Only
// limits that count tokens need a cost.
func (s *Server) cost(live *policy.Policy, d door) int {
	if !live.Limits.Enabled || !ratesOf(d.tier).CountsTokens() {
		return 0
	}
	cost := d.tokens
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

// enterRoom checks the pool's queue caps and takes the request into the
// waiting room: admitted at once when a start slot is free and the pool's
// queue is short, waiting otherwise. A full queue, room or tenant share
// is refused with 503 and Retry-After, before any workflow is started
// (the admission script enforces the queue caps too; this read spares
// Temporal the flood).
func (s *Server) enterRoom(ctx context.Context, d door, live *policy.Policy) (*waitroom.Waiter, error) {
	retry := max(1, int(s.cfg.Admission.RecheckInterval.Seconds()))
	total, mine, err := s.gate.Depth(ctx, d.pool, d.who.Tenant)
	switch {
	case err != nil:
		// Redis is unreachable or stalled: nothing could admit the
		// request anyway.
		s.logger.Warn("read queue depth", "pool", d.pool, "err", err)
		return nil, unavailable("the admission queue is unavailable; please retry")
	case total >= s.cfg.Admission.MaxQueueDepth:
		return nil, &apiError{Status: http.StatusServiceUnavailable, Code: request.ReasonQueueFull, RetryAfter: retry,
			Message: "The service is at capacity and its queue is full. Please retry shortly."}
	case d.tier.MaxQueuePerTenant > 0 && mine >= d.tier.MaxQueuePerTenant:
		return nil, errTenantQueueFull(retry)
	}
	w, err := s.room.Enter(waitroom.Ticket{
		Pool: d.pool, Tenant: d.who.Tenant, Weight: max(d.tier.Weight, 1), Cost: admission.TokenCost(d.tokens),
		MaxPerTenant: d.tier.MaxQueuePerTenant,
	}, s.canTake(live, d.pool, total, 0))
	switch {
	case errors.Is(err, waitroom.ErrTenantFull):
		return nil, errTenantQueueFull(retry)
	case err != nil:
		return nil, &apiError{Status: http.StatusServiceUnavailable, Code: request.ReasonBusy, RetryAfter: 1,
			Message: "Too many requests are waiting to start right now. Please retry in a moment."}
	}
	return w, nil
}

func errTenantQueueFull(retry int) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Code: request.ReasonTenantQueueFull, RetryAfter: retry,
		Message: "Your organisation already has as many requests waiting as its plan allows. Please retry when some have finished."}
}

// refuse gives back a request's whole charge when the door turns it away
// for want of capacity, records the refusal in its session and counts it.
func (s *Server) refuse(ctx context.Context, d door, req *chatRequest, err error) {
	s.refundAll(ctx, d.id, d.reservation)
	var ae *apiError
	if errors.As(err, &ae) {
		s.recordRefusal(ctx, d.who, *req, d.id, ae.Code)
		s.metrics.Refused(metrics.OutcomeOf(request.OutcomeRejected, ae.Code))
		s.logRefusal(ctx, d, ae.Code)
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
	if _, err := s.events.Append(ctx, d.id, events.TypeAccepted, events.Accepted{RequestID: d.id, Tenant: d.who.Tenant, User: d.who.User, KB: req.KB}); err != nil {
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
	err := s.sessions.Append(context.WithoutCancel(ctx), who.sessionOwner(), req.SessionID, session.Turn{
		RequestID: id, Query: req.Query, Outcome: request.OutcomeRejected, Reason: reason, At: time.Now().UTC(),
	})
	if err != nil {
		s.logger.Warn("record refusal in session", "requestID", id, "session", req.SessionID, "err", err)
	}
}
