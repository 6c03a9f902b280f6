package api

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/tracing"
	"github.com/sluice-dev/sluice/pkg/waitroom"
	"github.com/sluice-dev/sluice/workflows"
)

// startWhenAdmitted waits in the door's waiting room while the client
// reads its stream, and starts the request's workflow when its turn comes.
// Meanwhile it writes queue events with its place (the pool's admission
// queue ahead of it included). A request whose max wait runs out here is
// rejected with queue_timeout; one whose client left is dropped (it has no
// workflow to resume), and one whose stop flag was raised (DELETE, on any
// instance) is cancelled; either way it ends with a terminal event and
// its charge is given back.
func (s *Server) startWhenAdmitted(ctx context.Context, d door, req chatRequest, w *waitroom.Waiter) {
	defer w.Leave()
	maxWait := s.maxWait(d)
	deadline := time.NewTimer(maxWait - time.Since(d.arrived))
	defer deadline.Stop()
	poll := time.NewTicker(s.cfg.API.QueuePollInterval)
	defer poll.Stop()
	reported := 0
	for {
		reported = s.reportDoorPosition(ctx, d, w, reported)
		select {
		case <-w.Admitted():
			if ctx.Err() != nil {
				s.endAtDoor(ctx, d, req, s.leftFailure())
				return
			}
			waited := time.Since(d.arrived)
			if maxWait-waited < s.queueWait(ctx, d.pool) {
				// Too little of its wait is left to reach a permit through
				// the pool's queue: a workflow started now would only time
				// out there, spending Temporal what served requests need.
				s.endAtDoor(ctx, d, req, s.timeoutFailure(d))
				return
			}
			err := s.startChat(context.WithoutCancel(ctx), d, req, waited)
			s.started(w, d, err)
			if err != nil {
				s.logger.Error("start chat workflow after waiting at the door", "requestID", d.id, "err", err)
				s.endAtDoor(ctx, d, req, startFailure)
			}
			return
		case <-deadline.C:
			s.endAtDoor(ctx, d, req, s.timeoutFailure(d))
			return
		case <-ctx.Done():
			s.endAtDoor(ctx, d, req, s.leftFailure())
			return
		case <-poll.C:
			if stopped, _ := s.events.Stopped(ctx, d.id); stopped {
				s.endAtDoor(ctx, d, req, events.Failure{Reason: request.ReasonCancelled, Message: "The request was cancelled (client_request)."})
				return
			}
		}
	}
}

// startSettleMax bounds how long a started request still counts as
// starting toward its pool (waitroom.Waiter.Started) when it is not seen
// in the pool (an answer from the cache, a request that ended early, a
// slow worker): its first workflow task puts it in the pool's queue a few
// milliseconds after the start returns, longer on a loaded worker.
const startSettleMax = time.Second

// startPoll is how often the door looks for a started request in its
// pool: one Redis round trip each.
const startPoll = 10 * time.Millisecond

// started gives back a request's start slot once its start returned, and
// counts it as starting until it has reached its pool.
func (s *Server) started(w *waitroom.Waiter, d door, err error) {
	if err != nil {
		w.Leave()
		return
	}
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		ctx, cancel := context.WithTimeout(context.Background(), startSettleMax)
		defer cancel()
		tick := time.NewTicker(startPoll)
		defer tick.Stop()
		// Its first workflow task has not run yet when the start returns:
		// the first look is a poll interval later.
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if ok, err := s.gate.Reached(ctx, d.pool, d.id); ok || err != nil {
				return
			}
		}
	}()
	w.Started(settled, startSettleMax)
}

// queueWait is the expected wait of a request joining pool's queue now,
// at its tail.
func (s *Server) queueWait(ctx context.Context, pool string) time.Duration {
	st, err := s.poolStats(ctx, pool)
	if err != nil {
		return 0
	}
	return admission.EstimateWait(st.Waiting+1, st.Limit, st.MeanHold)
}

// maxWait is the request's whole wait for a permit, the door's share
// included: its tier's, else its pool's, else admission.max_wait.
func (s *Server) maxWait(d door) time.Duration {
	set := workflows.ChatSettingsFor(s.cfg, d.tier)
	if w, ok := set.MaxWaitByPool[d.pool]; ok {
		return w
	}
	return set.MaxWait
}

// timeoutFailure is the rejection of a request whose max wait ran out at
// the door; it may come back after the queue ahead of it has drained.
func (s *Server) timeoutFailure(d door) events.Failure {
	retry := time.Second
	if st, err := s.poolStats(context.Background(), d.pool); err == nil {
		retry = max(retry, admission.EstimateWait(st.Waiting+s.room.Stats().Waiting, st.Limit, st.MeanHold))
	}
	return events.Failure{
		Reason: request.ReasonQueueTimeout, RetryAfterS: int(math.Ceil(retry.Seconds())),
		Message: "The service is busy and your request waited too long in the queue. Please retry in a moment.",
	}
}

// leftFailure ends a request that left the waiting room before its turn:
// its client went away, or this process is shutting down.
func (s *Server) leftFailure() events.Failure {
	if s.draining.Load() {
		return events.Failure{Reason: request.ReasonBusy, RetryAfterS: 1,
			Message: "The service is restarting and your request had not started. Please retry."}
	}
	return events.Failure{Reason: request.ReasonCancelled, Message: "The request was cancelled (client_disconnected)."}
}

// endAtDoor ends a request that never started: its charge back, the
// refusal counted and recorded in its session, and its terminal event.
func (s *Server) endAtDoor(ctx context.Context, d door, req chatRequest, f events.Failure) {
	ctx = context.WithoutCancel(ctx)
	s.refundAll(ctx, d.id, d.reservation)
	typ, outcome := events.TypeRejected, request.OutcomeRejected
	if f.Reason == request.ReasonCancelled || f.Reason == request.ReasonUnavailable {
		typ, outcome = events.TypeError, request.OutcomeFailed
		if f.Reason == request.ReasonCancelled {
			outcome = request.OutcomeCancelled
		}
	}
	if outcome == request.OutcomeRejected {
		s.recordRefusal(ctx, d.who, req, d.id, f.Reason)
	}
	s.metrics.Refused(metrics.OutcomeOf(outcome, f.Reason))
	// Its one log line: it ended here, and no workflow will write another.
	request.Finished{
		RequestID: d.id, Tenant: d.who.Tenant, Route: d.pool, Outcome: outcome, Reason: f.Reason,
		Stages:  []request.StageTime{{Stage: request.StageAdmission, Ms: time.Since(d.arrived).Milliseconds()}},
		TraceID: tracing.TraceID(ctx),
	}.Log(ctx, s.logger)
	if err := s.appendDoorEnd(ctx, d.id, typ, f); err != nil {
		s.logger.Error("write the terminal event of a request that never started", "requestID", d.id, "err", err)
	}
}

// doorEndRetry bounds how long the door keeps trying to write a terminal
// event: longer than a Redis Cluster failover (node timeout plus the
// election) or a restart, during which the stream's slot is unreachable.
// No one else will end this request's stream: it has no workflow.
const doorEndRetry = 30 * time.Second

// appendDoorEnd writes a request's terminal event, trying again while
// Redis is unreachable (AppendFinal writes one end only, so a retry of
// a write that did land is harmless).
func (s *Server) appendDoorEnd(ctx context.Context, id, typ string, f events.Failure) error {
	ctx, cancel := context.WithTimeout(ctx, doorEndRetry)
	defer cancel()
	return retry(ctx, func() error {
		_, _, err := s.events.AppendFinal(ctx, id, typ, f)
		return err
	})
}

// reportDoorPosition writes a queue event when the request's place
// changed: its place in the waiting room behind the pool's admission
// queue. It returns the place reported.
func (s *Server) reportDoorPosition(ctx context.Context, d door, w *waitroom.Waiter, reported int) int {
	pos := w.Position()
	if pos == 0 {
		return reported
	}
	st, err := s.poolStats(ctx, d.pool)
	if err != nil {
		return reported
	}
	pos += st.Waiting
	if pos == reported {
		return reported
	}
	q := events.Queue{Position: pos, EstimatedWaitMs: admission.EstimateWait(pos, st.Limit, st.MeanHold).Milliseconds(), Pool: d.pool}
	if _, err := s.events.Append(ctx, d.id, events.TypeQueue, q); err != nil {
		s.logger.Warn("write queue event", "requestID", d.id, "err", err)
		return reported
	}
	return pos
}

// canTake reports whether pool's admission queue, holding depth requests
// with starting more on their way, is short enough for one more: fewer
// than api.queue_per_permit requests per permit.
func (s *Server) canTake(live *policy.Policy, pool string, depth, starting int) bool {
	per := s.cfg.API.QueuePerPermit
	if per == 0 {
		return true
	}
	limit := live.Pools[pool]
	return float64(depth+starting) < per*float64(max(limit, 1))
}

// poolReady is the waiting room's Ready: it reads the pool's backlog, the
// queue less the entries parked behind their tenant's concurrency cap (a
// free permit would not admit those, so they must not hold others here).
func (s *Server) poolReady(ctx context.Context, pool string, starting int) (bool, error) {
	if s.cfg.API.QueuePerPermit == 0 {
		return true, nil
	}
	backlog, err := s.gate.Backlog(ctx, pool)
	if err != nil {
		return false, err
	}
	return s.canTake(s.policy.Current(), pool, backlog, starting), nil
}

// poolStatsTTL is how long a pool's stats are reused for the positions
// and estimates of the requests waiting at the door: every waiter's
// stream asks each poll.
const poolStatsTTL = 250 * time.Millisecond

// statsCache keeps each pool's last stats for poolStatsTTL.
type statsCache struct {
	mu    sync.Mutex
	pools map[string]cachedStats
}

type cachedStats struct {
	at    time.Time
	stats admission.Stats
}

// poolStats reads pool's stats, at most once per poolStatsTTL.
func (s *Server) poolStats(ctx context.Context, pool string) (admission.Stats, error) {
	c := &s.stats
	c.mu.Lock()
	if e, ok := c.pools[pool]; ok && time.Since(e.at) < poolStatsTTL {
		c.mu.Unlock()
		return e.stats, nil
	}
	c.mu.Unlock()
	st, err := s.gate.Stats(ctx, pool)
	if err != nil {
		return st, err
	}
	c.mu.Lock()
	if c.pools == nil {
		c.pools = map[string]cachedStats{}
	}
	c.pools[pool] = cachedStats{at: time.Now(), stats: st}
	c.mu.Unlock()
	return st, nil
}
