package door

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/waitroom"
)

// startWhenAdmitted waits in the door's waiting room while the client
// reads its stream, and starts the request's workflow when its turn comes.
// Meanwhile it writes queue events with its place (the pool's admission
// queue ahead of it included). A request whose max wait runs out here is
// rejected with queue_timeout; one whose client left is dropped (it has no
// workflow to resume), and one whose stop flag was raised (DELETE, on any
// instance) is cancelled; either way it ends with a terminal event and
// its charge is given back.
func (d *Door) startWhenAdmitted(ctx context.Context, a arrival, req Request, w *waitroom.Waiter) {
	defer w.Leave()
	maxWait := d.maxWait(a)
	deadline := time.NewTimer(maxWait - time.Since(a.arrived))
	defer deadline.Stop()
	poll := time.NewTicker(d.cfg.API.QueuePollInterval)
	defer poll.Stop()
	stopped, unwatch := d.stops.watch(a.id)
	defer unwatch()
	var told admission.Told
	for {
		told = d.reportDoorPosition(ctx, a, w, told)
		select {
		case <-w.Admitted():
			a.admitted(w)
			if ctx.Err() != nil {
				d.endAtDoor(ctx, a, req, d.leftFailure())
				return
			}
			waited := time.Since(a.arrived)
			// A request that may pause a stream is not judged by the
			// turnover estimate (mayPause), so it costs no read of the queue.
			if !d.mayPause(a) {
				if ahead := d.queueWait(ctx, a); maxWait-waited < ahead {
					// Too little of its wait is left to reach a permit through
					// the pool's queue: a workflow started now would only time
					// out there, spending Temporal what served requests need.
					d.endAtDoor(ctx, a, req, d.lateFailure(a, ahead))
					return
				}
			}
			err := d.startChat(context.WithoutCancel(ctx), a, req, waited)
			d.started(w, a, err)
			if err != nil {
				d.logger.Error("start chat workflow after waiting at the door", "requestID", a.id, "err", err)
				d.endAtDoor(ctx, a, req, startFailure)
				// As for a start that fails at once: the key goes back,
				// after the end its replays read, for the retry the end
				// asks for.
				d.giveBack(ctx, holdings.Holdings{RequestID: a.id, Key: a.key})
			}
			return
		case <-deadline.C:
			a.leave(w)
			d.endAtDoor(ctx, a, req, d.lateFailure(a, 0))
			return
		case <-ctx.Done():
			a.leave(w)
			d.endAtDoor(ctx, a, req, d.leftFailure())
			return
		case <-stopped:
			a.leave(w)
			d.endAtDoor(ctx, a, req, events.Failure{Reason: request.ReasonCancelled, Message: "The request was cancelled (client_request)."})
			return
		case <-poll.C:
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
func (d *Door) started(w *waitroom.Waiter, a arrival, err error) {
	if w == nil {
		return // a background request, which held no slot
	}
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
			if ok, err := d.gate.Reached(ctx, a.pool, a.id); ok || err != nil {
				return
			}
		}
	}()
	w.Started(settled, startSettleMax)
}

// queueWait is the expected wait of a joining the pool's queue now: the
// entries its place in the fair order puts ahead of it (not the whole
// queue: a heavy tier's request goes ahead of a light tier's backlog),
// turned over by the permits its pool's group shares.
func (d *Door) queueWait(ctx context.Context, a arrival) time.Duration {
	st, err := d.poolStats(ctx, a.pool)
	if err != nil {
		return 0
	}
	var ahead int
	if a.place.Tag != 0 {
		ahead, err = d.gate.AheadOf(ctx, a.place)
	} else {
		ahead, err = d.gate.Ahead(ctx, a.pool, a.who.Tenant, max(a.class.Weight, 1), admission.TokenCost(a.admitTokens))
	}
	if err != nil {
		return 0
	}
	limit := st.Limit
	if n := d.gate.GroupLimit(a.pool); n > 0 {
		limit = n
	}
	return admission.EstimateWait(ahead+1, limit, st.MeanHold)
}

// mayPause reports whether a may have a stream paused for it
// (admission.preemption): preemption is on, a pool whose streams it may
// pause continues answers (config.Pools.PausesFor), and a class less urgent than its own exists. Its wait is then
// not the turnover of the permits ahead of it, which is all queueWait
// knows, so the door does not refuse it early by that estimate; its max
// wait still bounds it.
func (d *Door) mayPause(a arrival) bool {
	if !d.cfg.Admission.Preemption.Enabled || !request.PausesOthers(a.class.Rank) {
		return false
	}
	return d.cfg.Pools.PausesFor(a.pool)
}

// maxWait is the request's whole wait for a permit, the door's share
// included: its tier's, else its pool's, else admission.max_wait (a
// background request's: responses.background_max_wait); no longer than
// its class's TTFT SLO when the class refuses late requests (a permit
// after it could no longer meet it).
func (d *Door) maxWait(a arrival) time.Duration {
	set := ChatSettings(d.cfg, a.tier)
	w, ok := set.MaxWaitByPool[a.pool]
	if !ok {
		w = set.MaxWait
	}
	if a.background {
		w = d.cfg.Responses.BackgroundMaxWait
	}
	if a.class.RefuseLate {
		w = min(w, a.class.TTFTSLO)
	}
	return w
}

// refuseLate refuses, before it takes a place, a request of a class that
// refuses late requests (policy.ClassLimits.RefuseLate) when the wait
// estimated ahead of it is longer than what is left of its deadline: the
// place would only delay those behind it, and its client learns now,
// with Retry-After, rather than at the deadline. A pool with a permit
// free and nobody waiting has no wait ahead; a failed read refuses
// nothing (the deadline still bounds the wait).
func (d *Door) refuseLate(ctx context.Context, a arrival) *refusal.Error {
	if !a.class.RefuseLate || d.mayPause(a) {
		return nil
	}
	st, err := d.poolStats(ctx, a.pool)
	if err != nil || (st.Waiting == 0 && st.InUse < st.Limit) {
		return nil
	}
	ahead := d.queueWait(ctx, a)
	if ahead <= a.class.TTFTSLO-time.Since(a.arrived) {
		return nil
	}
	return refusal.Refused(refusal.Unavailable, request.Unreachable(a.class.Name, a.class.TTFTSLO, ahead, ahead))
}

// reportDoorPosition writes a queue event when the request's place
// changed enough to tell (admission.WorthTelling): its place in the
// waiting room behind the pool's admission queue. It returns what the
// client was told last.
func (d *Door) reportDoorPosition(ctx context.Context, a arrival, w *waitroom.Waiter, told admission.Told) admission.Told {
	pos := w.Position()
	if pos == 0 {
		return told
	}
	st, err := d.poolStats(ctx, a.pool)
	if err != nil {
		return told
	}
	pos += st.Waiting
	now := time.Now()
	if !admission.WorthTelling(told, pos, now) {
		return told
	}
	q := events.Queue{Position: pos, EstimatedWaitMs: admission.EstimateWait(pos, st.Limit, st.MeanHold).Milliseconds(), Pool: a.pool}
	if _, err := d.events.Append(ctx, a.id, events.TypeQueue, q); err != nil {
		d.logger.Warn("write queue event", "requestID", a.id, "err", err)
		return told
	}
	return admission.Told{Position: pos, At: now}
}

// canTake reports whether pool's admission queue, holding depth requests
// with starting more on their way, is short enough for one more: fewer
// than per (api.queue_per_permit; 0 is no bound) requests per permit.
func canTake(per float64, live *policy.Policy, pool string, depth, starting int) bool {
	if per == 0 {
		return true
	}
	limit := live.Pools[pool]
	return float64(depth+starting) < per*float64(max(limit, 1))
}

// reservePlace reserves a's place in its pool's fair order while it waits
// at the door (admission.Gate.Reserve): the room lines up by it and the
// workflow queues at it, so that the door's crowd and the pool's queue
// are one order on one clock. It reports whether a passes the room: the
// pool's queue is full (ready false) and fewer entries are ahead of its
// place than a request the room lets in has at most; the entries it
// joins ahead of are behind it in the fair order anyway, and waiting at
// the door would only add a permit turnover to its wait. Without a place
// (Redis failing) a waits by the room's own order.
func (d *Door) reservePlace(ctx context.Context, a *arrival, live *policy.Policy, ready bool) bool {
	// The place outlives the longest the request may wait here, and a
	// start: past that its door is gone, and the place lapses.
	ttl := d.maxWait(*a) + startSettleMax + d.cfg.Redis.RequestTimeout
	place, ahead, err := d.gate.Reserve(ctx, a.pool, a.who.Tenant, max(a.class.Weight, 1), admission.TokenCost(a.admitTokens), ttl)
	if err != nil {
		d.logger.Warn("reserve a place in the fair order", "requestID", a.id, "pool", a.pool, "err", err)
		return false
	}
	a.place = place
	per := d.cfg.API.QueuePerPermit
	return !ready && per > 0 && float64(ahead) < per*float64(max(live.Pools[a.pool], 1))
}

// poolReadiness is what the waiting room asks before it lets a request
// go on to its pool.
type poolReadiness struct {
	cfg    config.Config
	gate   *admission.Gate
	policy *policy.Store
}

// ready is the waiting room's Ready: it reads the pool's backlog, the
// queue less the entries parked behind their tenant's concurrency cap (a
// free permit would not admit those, so they must not hold others here).
func (r poolReadiness) ready(ctx context.Context, pool string, starting int) (bool, error) {
	if r.cfg.API.QueuePerPermit == 0 {
		return true, nil
	}
	backlog, err := r.gate.Backlog(ctx, pool)
	if err != nil {
		return false, err
	}
	return canTake(r.cfg.API.QueuePerPermit, r.policy.Current(), pool, backlog, starting), nil
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
func (d *Door) poolStats(ctx context.Context, pool string) (admission.Stats, error) {
	c := &d.stats
	c.mu.Lock()
	if e, ok := c.pools[pool]; ok && time.Since(e.at) < poolStatsTTL {
		c.mu.Unlock()
		return e.stats, nil
	}
	c.mu.Unlock()
	st, err := d.gate.Stats(ctx, pool)
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

// enterRoom checks the pool's queue caps and takes the request into the
// waiting room: admitted at once when a start slot is free and the pool's
// queue is short, waiting otherwise. A full queue, room or tenant share
// is refused with 503 and Retry-After, before any workflow is started
// (the admission script enforces the queue caps too; this read spares
// Temporal the flood). A background request is checked against the caps
// and takes no waiter (nil): it starts at once and waits in its pool's
// queue, which outlives this process, as the room's waiters do not.
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
	if err := d.refuseLate(ctx, *a); err != nil {
		return nil, err
	}
	if a.background {
		return nil, nil
	}
	ready := canTake(d.cfg.API.QueuePerPermit, live, a.pool, total, 0)
	pass := false
	if !ready || !d.room.Admits(a.pool) {
		pass = d.reservePlace(ctx, a, live, ready)
	}
	w, err := d.room.Enter(waitroom.Ticket{
		Pool: a.pool, Tenant: a.who.Tenant, Weight: max(a.class.Weight, 1), Cost: admission.TokenCost(a.admitTokens),
		MaxPerTenant: a.tier.MaxQueuePerTenant, Pass: pass, Tag: a.place.Tag, Shift: a.place.Shift, Charge: a.place.Charge,
		Deadline: a.deadline(), SLO: a.class.TTFTSLO,
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

// deadline is when a should have its first token: its arrival plus its
// class's TTFT SLO (zero: its class has none). A tenant's own requests
// are served earliest deadline first, in the room and in the queue.
func (a arrival) deadline() time.Time {
	if a.class.TTFTSLO <= 0 {
		return time.Time{}
	}
	return a.arrived.Add(a.class.TTFTSLO)
}

// admitted makes a's place the one its waiter held when it was admitted:
// a tenant's waiters swap places in the room by deadline
// (waitroom.Waiter.Place), so a's may be one another of its requests
// reserved, or none. Each place is held by one waiter at a time, and its
// charge goes with it: the request that queues at it settles what it
// used against that charge at release (admission's pay as you go), so
// nothing is charged twice.
func (a *arrival) admitted(w *waitroom.Waiter) {
	p := w.Place()
	switch {
	case p.Tag == a.place.Tag:
		// Its own: a tenant's tags are distinct.
	case p.Tag == 0:
		a.place = request.Place{}
	default:
		// Its weight and cost are read only for a place reserved without
		// its charge, which Reserve always returns.
		a.place = request.Place{
			Pool: a.pool, Tenant: a.who.Tenant, Weight: max(a.class.Weight, 1), Cost: cmp.Or(admission.TokenCost(a.admitTokens), 1),
			Tag: p.Tag, Charge: p.Charge, Shift: p.Shift,
		}
	}
}

// leave takes a's waiter out of the room (or gives back its start slot)
// and makes a's place the one it held then, which is a's to give back.
func (a *arrival) leave(w *waitroom.Waiter) {
	if w == nil {
		return // a background request, which never entered the room
	}
	w.Leave()
	a.admitted(w)
}
