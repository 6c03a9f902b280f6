package door

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
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
	class, ok := tier.Class(req.ServiceTier)
	if !ok {
		return adm, classRefused(req.ServiceTier, tier)
	}
	if tier.MaxOutputTokens > 0 && *req.MaxTokens > tier.MaxOutputTokens {
		// The tier's cap, not the caller's wish, bounds the answer.
		*req.MaxTokens = tier.MaxOutputTokens
	}
	pool, err := d.poolFor(d.route(rctx, who, req), req)
	if err != nil {
		return adm, err
	}
	req.pool = pool
	a := arrival{id: NewRequestID(), who: who, tier: tier, class: class, pool: pool, arrived: time.Now(), background: req.Background}
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
		a.leave(w)
		d.giveBack(ctx, a.holdings())
		return adm, err
	}
	if winner, err := d.claimKey(rctx, key, a); err != nil || winner != "" {
		// A request with the same key got there first (or the key could
		// not be claimed): this one never starts.
		sub.Close()
		a.leave(w)
		d.dropUnstarted(ctx, a)
		if err != nil {
			return adm, err
		}
		adm.ID = winner
		adm.Sub, err = d.attach(rctx, &adm.Standing, who, winner, req.LastEventID)
		return adm, err
	}
	adm.ID, adm.Pool = a.id, pool
	a.key = key
	if w != nil {
		select {
		case <-w.Admitted():
		default:
			go d.startWhenAdmitted(ctx, a, *req, w)
			adm.Sub = sub
			return adm, nil
		}
		a.admitted(w)
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

// classRefused refuses a service_tier the caller's plan does not grant.
func classRefused(asked string, tier policy.Tier) *refusal.Error {
	return &refusal.Error{Class: refusal.Invalid, Code: "service_tier_not_allowed", Param: ParamServiceTier,
		Message: fmt.Sprintf("service_tier %q is not part of this key's plan, which grants %s (or auto)", asked, strings.Join(tier.Grants(), ", "))}
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

// arrival is what the door decided about one request on its way in.
type arrival struct {
	id   string
	who  Caller
	tier policy.Tier
	// class is the service class it is served in (its service_tier, or
	// its tier's default), whose weight places it in the fair order.
	class policy.Class
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
	// background is a request no client waits for (Request.Background).
	background bool
}
