package door

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/pkg/waitroom"
)

// Admit takes a validated request through the door: idempotency, kb
// check, routing, rate limits, queue caps, the waiting room, event
// subscription and accepted event. Then it starts the request's workflow,
// at once when a start slot is free and the pool's queue is short, or
// from the waiting room when its turn comes (startWhenAdmitted). It
// returns the request's id and a subscription to its events from the
// first, which the caller must close and render; every later outcome
// reaches the client as an event. On error (a *refusal.Error) nothing was
// started and every charge was given back. The Admission's Standing holds
// what the client must hear either way (its rate limits and budget, a
// replay).
func (d *Door) Admit(ctx context.Context, who Caller, req *Request) (Admission, error) {
	var adm Admission
	if who.storeSilent {
		// The ban check already waited redis.request_timeout for Redis
		// in vain: its client was promised an answer within about that,
		// not twice it.
		return adm, refusal.Unreachable("the service's state store is not answering; please retry")
	}
	// The door's own Redis calls are bounded: with Redis stalled the
	// client hears 503 + Retry-After in about this long, not after it.
	rctx, cancel := context.WithTimeout(ctx, d.cfg.Redis.RequestTimeout)
	defer cancel()
	key, prior, sub, err := d.replay(rctx, &adm.Standing, who, req)
	if err != nil || prior != "" {
		adm.ID, adm.Sub = prior, sub
		return adm, err
	}
	if !req.Gateway {
		if err := d.checkKB(rctx, d.resolveChatKB(who, req)); err != nil {
			return adm, err
		}
	}
	live := d.policy.Current()
	tier, _ := live.Tier(who.Tier)
	if tier.MaxOutputTokens > 0 && *req.MaxTokens > tier.MaxOutputTokens {
		// The tier's cap, not the caller's wish, bounds the answer.
		*req.MaxTokens = tier.MaxOutputTokens
	}
	pool, err := d.poolFor(d.route(rctx, who, req), req)
	if err != nil {
		return adm, err
	}
	req.pool = pool
	a := arrival{id: NewRequestID(), who: who, tier: tier, pool: pool, arrived: time.Now()}
	a.tokens = d.tokenBound(req)
	a.admitTokens = d.admissionTokens(req)
	if err := d.charge(ctx, rctx, &adm.Standing, &a, req, live); err != nil {
		return adm, err
	}
	w, err := d.enterRoom(rctx, &a, live)
	if err != nil {
		d.refuse(ctx, a, req, err)
		return adm, err
	}
	sub, err = d.open(rctx, a, req)
	if err != nil {
		w.Leave()
		return adm, err
	}
	if winner, err := d.claimKey(rctx, key, a); err != nil || winner != "" {
		// A request with the same key got there first (or the key could
		// not be claimed): this one never starts.
		sub.Close()
		w.Leave()
		d.dropUnstarted(ctx, a)
		if err != nil {
			return adm, err
		}
		adm.ID = winner
		adm.Sub, err = d.attach(rctx, &adm.Standing, winner, req.LastEventID)
		return adm, err
	}
	adm.ID, adm.Pool = a.id, pool
	a.key = key
	select {
	case <-w.Admitted():
	default:
		go d.startWhenAdmitted(ctx, a, *req, w)
		adm.Sub = sub
		return adm, nil
	}
	err = d.startChat(ctx, a, *req, 0)
	d.started(w, a, err)
	if err != nil {
		d.logger.Error("start chat workflow", "requestID", a.id, "err", err)
		sub.Close()
		d.dropUnstarted(ctx, a)
		adm.ID, adm.Pool = "", ""
		return adm, refusal.Unreachable("could not start the request; please retry")
	}
	adm.Sub = sub
	return adm, nil
}

// charge charges the request to its caller's rate limits, then to its
// tenant's monthly budget; a refusal by either takes back what the other
// took, and is counted and logged. rctx bounds the Redis calls; ctx is
// the request's.
func (d *Door) charge(ctx, rctx context.Context, st *Standing, a *arrival, req *Request, live *policy.Policy) error {
	var err error
	a.reservation, err = d.reserve(rctx, st, a.id, a.who, a.tier, live.Limits.Enabled, d.cost(live, *a))
	if err == nil {
		if a.budget, err = d.reserveBudget(rctx, st, *a, req); err != nil {
			d.giveBack(ctx, holdings.Holdings{RequestID: a.id, Rate: a.reservation})
		}
	}
	var ae *refusal.Error
	if errors.As(err, &ae) && ae.Class == refusal.Limited {
		outcome := metrics.OutcomeRejectedRate
		if ae.Code == request.ReasonBudgetExceeded {
			outcome = metrics.OutcomeOf(request.OutcomeRejected, ae.Code)
		}
		d.metrics.Refused(outcome)
		d.logRefusal(ctx, *a, ae.Code)
	}
	return err
}

// Admission is a request the door let in (or a request an earlier POST
// with the same Idempotency-Key started).
type Admission struct {
	// ID is the request's id.
	ID string
	// Sub follows its events from the first; the caller closes it.
	Sub *events.Subscription
	// Pool is the pool the door routed it to ("" for a replay).
	Pool string
	// Standing is what the client is told whatever the outcome: its rate
	// limits and budget, and whether this is a replay.
	Standing Standing
}

// startFailure ends a request whose workflow could not be started: the
// workflow service did not take it, which a retry may well get past.
var startFailure = request.Refused(request.ReasonUnavailable, time.Second)

// arrival is what the door decided about one request on its way in.
type arrival struct {
	id   string
	who  Caller
	tier policy.Tier
	// pool is the request's route; admission queues it there.
	pool string
	// tokens is the most the request can take (tokenBound), which the
	// rate limits charge.
	tokens int
	// admitTokens is its size in the waiting room's and the admission
	// queue's token-fair order (admissionTokens).
	admitTokens int
	// reservation is its rate-limit charge ("" when none applied).
	reservation string
	// budget is its monthly budget charge ("" when its tier has none).
	budget string
	// place is its place in the pool's fair order, reserved while it
	// waits at the door (Tag 0: none); its workflow queues there.
	place request.Place
	// key is the Idempotency-Key it claimed (nil: none), given back when
	// its workflow cannot be started so that the client's retry runs.
	key *idempotency.Key
	// arrived starts the request's max wait, the door's share included.
	arrived time.Time
}

// checkKB refuses a request for a knowledge base that does not exist.
func (d *Door) checkKB(ctx context.Context, kb kbref.Ref) error {
	known, err := d.kbs.Known(ctx, kb)
	switch {
	case err != nil:
		d.logger.Error("look up kb", "kb", kb, "err", err)
		return refusal.Unreachable("knowledge bases unavailable; please retry")
	case !known:
		return refusal.BadRequest("unknown_kb", "unknown knowledge base %q", kb.Name)
	}
	return nil
}

// route picks the request's pool by the rule and inputs admission uses:
// the prompt's bound before retrieval and the tokens of the session turns
// it will carry. The workflow is started with this pool, so the queue the
// door checks is the queue the request joins. A session that cannot be
// read is asked without its history, as the stream would.
func (d *Door) route(ctx context.Context, who Caller, req *Request) string {
	history := 0
	if req.SessionID != "" && d.sessions != nil {
		var err error
		_, history, err = d.sessions.History(ctx, d.prompts, who.SessionOwner(), req.SessionID, d.cfg.Sessions.HistoryTokens)
		if err != nil {
			d.logger.Warn("read session to route; routing without its history", "session", req.SessionID, "err", err)
		}
	}
	return request.Route(d.promptBound(req), history, d.cfg.Routing.ShortThresholdTokens)
}

// promptBound is the prompt's upper bound before retrieval: the query (or
// the client's conversation) and top_k full chunks; a gateway request's
// prompt is its conversation alone.
func (d *Door) promptBound(req *Request) int {
	switch {
	case req.Gateway:
		return req.promptTokens
	case req.Conversation != nil:
		return d.prompts.BoundForQueryTokens(req.promptTokens, d.cfg.Retrieval.TopK, d.cfg.Retrieval.ChunkTokens)
	}
	return d.prompts.BoundForQueryTokens(d.queryTokens(req), d.cfg.Retrieval.TopK, d.cfg.Retrieval.ChunkTokens)
}

// tokenBound is the most tokens a request can take: the prompt with a
// full context, the whole session budget and every output token it may
// produce.
func (d *Door) tokenBound(req *Request) int {
	tokens := d.promptBound(req) + max(req.Choices, 1)*(*req.MaxTokens)
	if req.SessionID != "" {
		tokens += d.cfg.Sessions.HistoryTokens
	}
	return tokens
}

// admissionTokens is the request's size in the fair queue and the
// waiting room: tokenBound with each output token weighted by
// admission.output_token_weight (1: tokenBound itself).
func (d *Door) admissionTokens(req *Request) int {
	output := max(req.Choices, 1) * (*req.MaxTokens)
	w := d.cfg.Admission.OutputTokenWeight
	if w <= 0 {
		// A configuration built without defaults: tokens as they are.
		w = 1
	}
	return d.tokenBound(req) - output + int(math.Round(w*float64(output)))
}

// cost is what the rate limits charge a request up front: its token bound
// (a.tokens). The workflow refunds what it did not use when it ends. Only
// limits that count tokens need a cost.
func (d *Door) cost(live *policy.Policy, a arrival) int {
	if !live.Limits.Enabled || !RatesOf(a.tier).CountsTokens() {
		return 0
	}
	cost := a.tokens
	// While the healer throttles long requests, a request routed long must
	// find factor times its tokens in its buckets: a tenant's long
	// requests are refused sooner, short ones are unaffected. The refund still
	// gives back the unused part, so the factor bounds how many long
	// requests a tenant starts at once, not what it pays.
	if f := live.ChargeFactor(a.pool); f > 1 {
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
func (d *Door) enterRoom(ctx context.Context, a *arrival, live *policy.Policy) (*waitroom.Waiter, error) {
	total, mine, err := d.gate.Depth(ctx, a.pool, a.who.Tenant)
	switch {
	case err != nil:
		// Redis is unreachable or stalled: nothing could admit the
		// request anyway.
		d.logger.Warn("read queue depth", "pool", a.pool, "err", err)
		return nil, refusal.Unreachable("the admission queue is unavailable; please retry")
	case total >= d.cfg.Admission.MaxQueueDepth:
		return nil, refusal.Refused(refusal.Unavailable, request.Refused(request.ReasonQueueFull, d.cfg.Admission.RecheckInterval))
	case a.tier.MaxQueuePerTenant > 0 && mine >= a.tier.MaxQueuePerTenant:
		return nil, d.tenantQueueFull()
	}
	ready := canTake(d.cfg.API.QueuePerPermit, live, a.pool, total, 0)
	pass := false
	if !ready || !d.room.Admits(a.pool) {
		pass = d.reservePlace(ctx, a, live, ready)
	}
	w, err := d.room.Enter(waitroom.Ticket{
		Pool: a.pool, Tenant: a.who.Tenant, Weight: max(a.tier.Weight, 1), Cost: admission.TokenCost(a.admitTokens),
		MaxPerTenant: a.tier.MaxQueuePerTenant, Pass: pass, Tag: a.place.Tag,
	}, ready || pass)
	switch {
	case errors.Is(err, waitroom.ErrTenantFull):
		return nil, d.tenantQueueFull()
	case err != nil:
		return nil, &refusal.Error{Class: refusal.Unavailable, Code: request.ReasonBusy, RetryAfter: 1,
			Message: "Too many requests are waiting to start right now. Please retry in a moment."}
	}
	return w, nil
}

// tenantQueueFull refuses a request whose tenant has as many requests
// waiting as its plan allows.
func (d *Door) tenantQueueFull() *refusal.Error {
	return refusal.Refused(refusal.Unavailable, request.Refused(request.ReasonTenantQueueFull, d.cfg.Admission.RecheckInterval))
}

// refuse gives back a request's whole charge when the door turns it away
// for want of capacity, records the refusal in its session and counts it.
func (d *Door) refuse(ctx context.Context, a arrival, req *Request, err error) {
	d.giveBack(ctx, a.holdings())
	var ae *refusal.Error
	if errors.As(err, &ae) {
		d.recordRefusal(ctx, a.who, *req, a.id, ae.Code)
		d.metrics.Refused(metrics.OutcomeOf(request.OutcomeRejected, ae.Code))
		d.logRefusal(ctx, a, ae.Code)
	}
}

// open subscribes to the request's events and writes its accepted event.
// Subscribing first means the events the workflow writes while its start
// call is still returning are already buffered for the client; the
// accepted event is the stream's first entry whatever the workflow writes.
func (d *Door) open(ctx context.Context, a arrival, req *Request) (*events.Subscription, error) {
	sub, err := d.hub.Subscribe(ctx, a.id, "0")
	if err != nil {
		d.logger.Error("subscribe to events", "requestID", a.id, "err", err)
		d.giveBack(ctx, a.holdings())
		return nil, refusal.Unreachable("event stream unavailable")
	}
	if _, err := d.events.Append(ctx, a.id, events.TypeAccepted, events.Accepted{RequestID: a.id, Tenant: a.who.Tenant, User: a.who.User, KB: req.KB}); err != nil {
		d.logger.Error("write accepted event", "requestID", a.id, "err", err)
		sub.Close()
		d.giveBack(ctx, a.holdings())
		return nil, refusal.Unreachable("event store unavailable")
	}
	return sub, nil
}

// recordRefusal records a request the door turned away for want of
// capacity in its session, as the workflow does with a request its queue
// turned away: the session's next turn then knows its question went
// unanswered. Refusals by the rate limits are not recorded: a flood must
// cost one Redis call per request, and its Retry-After already says when.
func (d *Door) recordRefusal(ctx context.Context, who Caller, req Request, id, reason string) {
	if d.sessions == nil || req.SessionID == "" {
		return
	}
	err := d.sessions.Append(context.WithoutCancel(ctx), who.SessionOwner(), req.SessionID, session.Turn{
		RequestID: id, Query: req.Query, Outcome: request.OutcomeRejected, Reason: reason, At: time.Now().UTC(),
	})
	if err != nil {
		d.logger.Warn("record refusal in session", "requestID", id, "session", req.SessionID, "err", err)
	}
}

// logRefusal writes the "request finished" line of a request the door
// refused before any workflow (rate_limited, queue_full,
// tenant_queue_full, busy, unavailable), sampled per tenant and reason:
// the line carries how many more were refused meanwhile
// (request.Finished.Similar).
func (d *Door) logRefusal(ctx context.Context, a arrival, reason string) {
	similar, ok := d.refusals.Allow(a.who.Tenant + "\x00" + reason)
	if !ok {
		return
	}
	request.Finished{
		RequestID: a.id, Tenant: a.who.Tenant, Route: a.pool, Outcome: request.OutcomeRejected, Reason: reason,
		TraceID: tracing.TraceID(ctx), Similar: similar,
	}.Log(ctx, d.logger)
}
