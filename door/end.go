package door

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/backoff"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/tracing"
)

// This file is how a request that never started ends: refused at the door
// or ended in its waiting room, with what it holds given back.

// holdings is what a that never started holds: its place in its pool's
// fair order, its rate-limit reservation and its budget charge.
func (a arrival) holdings() holdings.Holdings {
	return holdings.Holdings{RequestID: a.id, Place: a.place, Rate: a.reservation, Budget: a.budget}
}

// dropUnstarted undoes a request that the door accepted but never started:
// its event stream is deleted, or, when it claimed an idempotency key
// (whoever attached with the key meanwhile reads it), ended and the key
// given back for the client's retry; and what it holds is given back.
func (d *Door) dropUnstarted(ctx context.Context, a arrival) {
	h := a.holdings()
	if a.key == nil {
		_ = d.events.Delete(context.WithoutCancel(ctx), a.id)
	} else {
		d.endUnstarted(ctx, a.id)
		h.Key = a.key
	}
	d.giveBack(ctx, h)
}

// endUnstarted ends the stream of a request whose workflow could not be
// started, for whoever attached to it by its idempotency key. Its client
// is refused at once, so the end gets one try of redis.request_timeout:
// with Redis down, the key's retention runs out.
func (d *Door) endUnstarted(ctx context.Context, id string) {
	if err := d.writeEnd(context.WithoutCancel(ctx), id, events.TypeError, startFailure, d.cfg.Redis.RequestTimeout); err != nil {
		d.logger.Warn("end the stream of a request that could not be started", "requestID", id, "err", err)
	}
}

// giveBack returns h, held by a request that never started (so it used
// nothing), without holding up the client's answer: one try within the
// Redis request timeout, then, with Redis stalled or gone, what is still
// held is retried in the background until it is given back or the refund
// patience runs out (holdings.Returner.GiveBackCharges: every step but
// the place's is idempotent, and a place is tried once).
func (d *Door) giveBack(ctx context.Context, h holdings.Holdings) {
	used := holdings.Used{Rate: &holdings.RateUse{}}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.refundPatience())
	first, stop := context.WithTimeout(ctx, d.cfg.Redis.RequestTimeout)
	rest, err := d.returner.GiveBackCharges(first, h, used)
	stop()
	if err == nil {
		cancel()
		return
	}
	go func() {
		defer cancel()
		err := retry(ctx, func() error {
			var err error
			rest, err = d.returner.GiveBackCharges(ctx, rest, used)
			return err
		})
		if err != nil {
			d.logger.Warn("give back what a request that never started held: gave up (a rate charge refills with its bucket, a budget charge stays in its month)",
				"requestID", h.RequestID, "err", err)
		}
	}()
}

// refundPatience is how long a give-back is retried: as long as a rate
// reservation lives.
func (d *Door) refundPatience() time.Duration { return d.cfg.Admission.MaxWait + 10*time.Minute }

// redisBackoff paces the door's writes to a Redis that is stalled or
// away until they land or their context ends: from 100 ms to 5 s.
var redisBackoff = backoff.Policy{First: 100 * time.Millisecond, Max: 5 * time.Second}

// retry calls f until it succeeds or ctx ends (redisBackoff).
func retry(ctx context.Context, f func() error) error { return redisBackoff.Retry(ctx, 0, f) }

// startFailure ends a request whose workflow could not be started: the
// workflow service did not take it, which a retry may well get past.
var startFailure = request.Refused(request.ReasonUnavailable, time.Second)

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
		TraceID: tracing.TraceID(ctx), Similar: similar, ServiceTier: a.class.Name,
	}.Log(ctx, d.logger)
}

// lateFailure is the rejection of a request whose max wait ran out at
// the door, or would before a permit (ahead, the wait estimated ahead of
// it; 0 when its wait ran out); it may come back after the queue ahead of
// it has drained. A request of a class that refuses late requests is told
// that its deadline was out of reach.
func (d *Door) lateFailure(a arrival, ahead time.Duration) events.Failure {
	retry := time.Second
	if st, err := d.poolStats(context.Background(), a.pool); err == nil {
		retry = max(retry, admission.EstimateWait(st.Waiting+d.room.Stats().Waiting, st.Limit, st.MeanHold))
	}
	if a.class.RefuseLate {
		return request.Unreachable(a.class.Name, a.class.TTFTSLO, ahead, retry)
	}
	return request.Refused(request.ReasonQueueTimeout, retry)
}

// leftFailure ends a request that left the waiting room before its turn:
// its client went away, or this process is shutting down.
func (d *Door) leftFailure() events.Failure {
	if d.draining.Load() {
		return events.Failure{Reason: request.ReasonBusy, RetryAfterS: 1,
			Message: "The service is restarting and your request had not started. Please retry."}
	}
	return events.Failure{Reason: request.ReasonCancelled, Message: "The request was cancelled (client_disconnected)."}
}

// endAtDoor ends a request that never started: its charge back, the
// refusal counted and recorded in its session, and its terminal event.
func (d *Door) endAtDoor(ctx context.Context, a arrival, req Request, f events.Failure) {
	ctx = context.WithoutCancel(ctx)
	d.giveBack(ctx, a.holdings())
	typ, outcome := events.TypeRejected, request.OutcomeRejected
	if f.Reason == request.ReasonCancelled || f.Reason == request.ReasonUnavailable {
		typ, outcome = events.TypeError, request.OutcomeFailed
		if f.Reason == request.ReasonCancelled {
			outcome = request.OutcomeCancelled
		}
	}
	if outcome == request.OutcomeRejected {
		d.recordRefusal(ctx, a.who, req, a.id, f.Reason)
	}
	d.metrics.Refused(metrics.OutcomeOf(outcome, f.Reason))
	// Its one log line: it ended here, and no workflow will write another.
	request.Finished{
		RequestID: a.id, Tenant: a.who.Tenant, Route: a.pool, Outcome: outcome, Reason: f.Reason,
		Stages:      []request.StageTime{{Stage: request.StageAdmission, Ms: time.Since(a.arrived).Milliseconds()}},
		TraceID:     tracing.TraceID(ctx),
		ServiceTier: a.class.Name,
	}.Log(ctx, d.logger)
	if err := d.writeEnd(ctx, a.id, typ, f, doorEndRetry); err != nil {
		d.logger.Error("write the terminal event of a request that never started", "requestID", a.id, "err", err)
	}
}

// doorEndRetry bounds how long the door keeps trying to write a terminal
// event: longer than a Redis Cluster failover (node timeout plus the
// election) or a restart, during which the stream's slot is unreachable.
// No one else will end this request's stream: it has no workflow.
const doorEndRetry = 30 * time.Second

// writeEnd writes the terminal event of a request that never started,
// the door's one writer of an end: it tries again for up to patience
// while Redis is unreachable (AppendFinal writes one end only, so a retry
// of a write that did land is harmless).
func (d *Door) writeEnd(ctx context.Context, id, typ string, f events.Failure, patience time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	return retry(ctx, func() error {
		_, _, err := d.events.AppendFinal(ctx, id, typ, f)
		return err
	})
}
