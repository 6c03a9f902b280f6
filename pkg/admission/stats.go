package admission

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Position returns requestID's 1-based queue position, counting the
// entries ahead of it in every pool of its group, or ok=false if it is not
// queued (granted, gone, or never there).
func (g *Gate) Position(ctx context.Context, pool, requestID string) (int, bool, error) {
	queue := g.keys(pool).queue
	pipe := g.cmd.Pipeline()
	rank := pipe.ZRank(ctx, queue, requestID)
	tag := pipe.ZScore(ctx, queue, requestID)
	if _, err := pipe.Exec(ctx); errors.Is(err, redis.Nil) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, fmt.Errorf("queue position of %s in pool %s: %w", requestID, pool, err)
	}
	pos := int(rank.Val()) + 1
	// One slot (the group's tag): a second round trip only in a group.
	others := g.others(pool)
	if len(others) == 0 {
		return pos, true, nil
	}
	pipe = g.cmd.Pipeline()
	below := "(" + strconv.FormatFloat(tag.Val(), 'f', 0, 64)
	counts := make([]*redis.IntCmd, len(others))
	for i, o := range others {
		counts[i] = pipe.ZCount(ctx, g.keys(o).queue, "-inf", below)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, false, fmt.Errorf("queue position of %s in pool %s's group: %w", requestID, pool, err)
	}
	for _, c := range counts {
		pos += int(c.Val())
	}
	return pos, true, nil
}

// Stats is a pool's current state.
type Stats struct {
	InUse    int
	Waiting  int
	Limit    int
	MeanHold time.Duration
}

// Stats reads a pool's permits in use, queue depth and limit. Expired
// permits still count until the next script reclaims them.
func (g *Gate) Stats(ctx context.Context, pool string) (Stats, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return Stats{}, err
	}
	k := g.keys(pool)
	pipe := g.cmd.Pipeline()
	inUse := pipe.ZCard(ctx, k.permits)
	waiting := pipe.ZCard(ctx, k.queue)
	stats := pipe.HMGet(ctx, k.stats, "limit", "ewma_ms")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Stats{}, fmt.Errorf("read stats of pool %s: %w", pool, err)
	}
	s := Stats{InUse: int(inUse.Val()), Waiting: int(waiting.Val()), Limit: limit}
	vals := stats.Val()
	if v, ok := vals[0].(string); ok {
		if n, err := strconv.Atoi(v); err == nil {
			s.Limit = n
		}
	}
	if v, ok := vals[1].(string); ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			s.MeanHold = time.Duration(n) * time.Millisecond
		}
	}
	return s, nil
}

// QueueStats is a pool's queue as the admin view shows it.
type QueueStats struct {
	Limit int
	// InUse counts permits whose lease has not run out.
	InUse int
	// Waiting is the queue's depth, zombies not yet dropped included.
	Waiting int
	// ByTenant is each tenant's entries in the queue; tenants with none
	// are absent.
	ByTenant map[string]int
	// Parked counts the entries whose tenant holds as many permits as its
	// tier allows: they wait for one of its own to come back, not for a
	// free permit.
	Parked int
	// HeldByTenant is each tenant's permits (those granted before tenants
	// were counted excepted); tenants with none are absent.
	HeldByTenant map[string]int
	// ParkedByTenant is each parked tenant's entries: all of its queue,
	// held back while its first entry waits for one of its own permits.
	ParkedByTenant map[string]int
	// OldestWait is how long the longest-waiting entry has been queued
	// (since its last restore, for a restored one); 0 when nobody waits.
	OldestWait time.Duration
	MeanHold   time.Duration
}

// QueueStats reads one consistent snapshot of a pool's queue and permits.
func (g *Gate) QueueStats(ctx context.Context, pool string) (QueueStats, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return QueueStats{}, err
	}
	raw, err := statsScript.Run(ctx, g.rdb, g.scriptKeys(pool), limit).Slice()
	if err != nil {
		return QueueStats{}, fmt.Errorf("read queue stats of pool %s: %w", pool, err)
	}
	// The reply is a head of 7, then three runs of tenant, count pairs:
	// the first two after their lengths, the last to the end.
	const head = 7
	depth, held, ok := sections(raw, head)
	if !ok {
		return QueueStats{}, fmt.Errorf("read queue stats of pool %s: malformed reply %v", pool, raw)
	}
	s := QueueStats{
		Limit:          int(toInt(raw[0])),
		InUse:          int(toInt(raw[1])),
		Waiting:        int(toInt(raw[2])),
		MeanHold:       time.Duration(toInt(raw[3])) * time.Millisecond,
		Parked:         int(toInt(raw[5])),
		ByTenant:       pairs(raw[head:depth]),
		HeldByTenant:   pairs(raw[depth+1 : held]),
		ParkedByTenant: pairs(raw[held:]),
	}
	if age := toInt(raw[4]); age > 0 {
		s.OldestWait = time.Duration(age) * time.Millisecond
	}
	return s, nil
}

// sections finds where the depth pairs of a stats reply end (at the held
// pairs' length) and where the held pairs end (the parked pairs begin).
func sections(raw []any, head int) (depthEnd, heldEnd int, ok bool) {
	if len(raw) < head+1 {
		return 0, 0, false
	}
	n := int(toInt(raw[head-1]))
	depthEnd = head + n
	if n < 0 || n%2 != 0 || depthEnd >= len(raw) {
		return 0, 0, false
	}
	m := int(toInt(raw[depthEnd]))
	heldEnd = depthEnd + 1 + m
	if m < 0 || m%2 != 0 || heldEnd > len(raw) || (len(raw)-heldEnd)%2 != 0 {
		return 0, 0, false
	}
	return depthEnd, heldEnd, true
}

// Backlog is each tenant's entries that wait for a free permit: its queue
// unless it is parked behind its own cap (Gate.Backlog, per tenant).
// Tenants with none are absent.
func (s QueueStats) Backlog() map[string]int {
	out := make(map[string]int, len(s.ByTenant))
	for tenant, n := range s.ByTenant {
		if n -= s.ParkedByTenant[tenant]; n > 0 {
			out[tenant] = n
		}
	}
	return out
}

// pairs reads a flat tenant, count, ... reply.
func pairs(raw []any) map[string]int {
	m := make(map[string]int, len(raw)/2)
	for i := 0; i+1 < len(raw); i += 2 {
		tenant, _ := raw[i].(string)
		m[tenant] = int(toInt(raw[i+1]))
	}
	return m
}

// Depth returns how many requests wait in pool, and how many of them are
// tenant's, in one round trip. The API reads it to refuse a flood at the
// door, before starting workflows that could only be turned away;
// Enqueue still enforces the caps atomically.
func (g *Gate) Depth(ctx context.Context, pool, tenant string) (total, ofTenant int, err error) {
	k := g.keys(pool)
	pipe := g.cmd.Pipeline()
	q := pipe.ZCard(ctx, k.queue)
	tc := pipe.HGet(ctx, k.tenants, tenant)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("read queue depth of pool %s: %w", pool, err)
	}
	n, _ := strconv.Atoi(tc.Val())
	return int(q.Val()), n, nil
}

// Backlog returns how many requests in pool's queue wait for a free permit:
// the queue less the entries parked behind their tenant's concurrency cap,
// which a free permit would not admit. The door reads it to decide whether
// the queue can take more: a capped tenant's parked backlog must not hold
// everyone else at the door while permits sit free.
func (g *Gate) Backlog(ctx context.Context, pool string) (int, error) {
	k := g.keys(pool)
	pipe := g.cmd.Pipeline()
	q := pipe.ZCard(ctx, k.queue)
	parked := pipe.HGet(ctx, k.stats, "parked")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("read backlog of pool %s: %w", pool, err)
	}
	n, _ := strconv.Atoi(parked.Val())
	return max(int(q.Val())-n, 0), nil
}

// Reached reports whether requestID has reached pool: it is queued, holds
// a permit, or has already given its permit back. The door asks it of a
// request it just started, whose first workflow task enqueues it.
func (g *Gate) Reached(ctx context.Context, pool, requestID string) (bool, error) {
	k := g.keys(pool)
	// One slot (the pool's tag): one round trip on a cluster too.
	pipe := g.cmd.Pipeline()
	queued := pipe.ZScore(ctx, k.queue, requestID)
	held := pipe.ZScore(ctx, k.permits, requestID)
	released := pipe.Exists(ctx, k.tombPrefix+requestID)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("has %s reached pool %s: %w", requestID, pool, err)
	}
	return queued.Err() == nil || held.Err() == nil || released.Val() > 0, nil
}

// Ahead returns how many requests queued in pool's group a new request of
// tenant at weight and cost would wait behind in the fair order: a heavy
// tier's request joins ahead of a light tier's backlog, so the queue's
// depth overstates its wait. Cost 0 counts as 1, as Enqueue does.
func (g *Gate) Ahead(ctx context.Context, pool, tenant string, weight int, cost float64) (int, error) {
	if _, err := g.limit(pool); err != nil {
		return 0, err
	}
	if cost == 0 {
		cost = 1
	}
	if weight <= 0 || !(cost > 0) {
		return 0, fmt.Errorf("entries ahead in pool %s: weight %d and cost %v must be > 0", pool, weight, cost)
	}
	n, err := aheadScript.Run(ctx, g.rdb, g.scriptKeys(pool), tenant, weight, strconv.FormatFloat(cost, 'g', -1, 64), 0, 0).Int()
	if err != nil {
		return 0, fmt.Errorf("entries ahead in pool %s: %w", pool, err)
	}
	return n, nil
}

// positionRefresh is the longest a waiter's changed place goes untold.
const positionRefresh = 5 * time.Second

// Told is the place a waiter was last told, and when.
type Told struct {
	Position int
	At       time.Time
}

// WorthTelling reports whether a waiter last told told should hear that
// its place is now pos, at now: every move near the head, where each place
// is about a permit's turnover; far back, a move of a twentieth of its
// place, or any move positionRefresh after it was last told. A client far
// back learns little from each step, and a backlog of thousands told of
// every step costs the event log a write, the event hub a read and the
// client a frame per waiter per admission.
func WorthTelling(told Told, pos int, now time.Time) bool {
	if pos == told.Position {
		return false
	}
	if told.Position <= 0 {
		return true
	}
	moved := pos - told.Position
	if moved < 0 {
		moved = -moved
	}
	return moved*20 >= told.Position || now.Sub(told.At) >= positionRefresh
}
