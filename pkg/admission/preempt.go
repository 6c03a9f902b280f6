package admission

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/request"
)

// Preemption by continuation: a waiter of an urgent class that finds no
// permit free asks for a less urgent stream to be paused (Preempt); every
// stream that can be paused says so each keep-alive round and learns in
// the same round trip whether it was asked (Pausable); one that was stops
// its upstream call, keeps its text, and gives its permit to that waiter
// while it re-queues at the head of the fair order (Yield); it waits for
// its grant again as any waiter does, and continues the answer where it
// stopped.

var (
	//go:embed lua/preempt.lua
	preemptLua string
	//go:embed lua/pausable.lua
	pausableLua string
	//go:embed lua/yield.lua
	yieldLua string

	preemptScript  = redis.NewScript(preemptLua)
	pausableScript = redis.NewScript(pausableLua)
	yieldScript    = redis.NewScript(prelude + yieldLua)
)

// PauseRules bound how often one stream may be paused.
type PauseRules struct {
	// MinTokens is how many tokens a stream streams after each (re)start
	// before it may be paused: a pause costs the continued prefix's
	// prefill, which a stream paused at once would pay for nothing.
	MinTokens int
	// MaxPauses is how many times one stream may be paused.
	MaxPauses int
}

// pauseKeys are the pool's pausable and asked hashes (preempt.lua).
func (g *Gate) pauseKeys(pool string) (pausable, asked string) {
	k := g.keys(pool)
	return k.pausable, k.asked
}

// Preempt asks for a stream to be paused for waiterID, queued in pool,
// of class rank (request.ClassRank), when waiterID is next in line for a
// permit and none is free: a stream of pool when pool is at its limit,
// or of any pool of its group when the group's budget is spent. It
// returns the stream asked ("" when none may be paused: none is of a less
// urgent class, or each is within its first MinTokens tokens or at
// MaxPauses). Asking again for the same waiter names the same stream
// until it has paused. A waiter that is not queued in pool (granted, or
// gone) gets ErrNotQueued.
func (g *Gate) Preempt(ctx context.Context, pool, waiterID string, rank int, rules PauseRules) (string, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return "", err
	}
	k := g.keys(pool)
	pausable, asked := g.pauseKeys(pool)
	keys := []string{k.permits, k.stats, k.queue, k.waiters, k.heads, pausable, asked}
	for _, o := range g.others(pool) {
		op, oa := g.pauseKeys(o)
		keys = append(keys, g.keys(o).permits, op, oa)
	}
	victim, err := preemptScript.Run(ctx, g.rdb, keys,
		waiterID, rank, limit, rules.MinTokens, rules.MaxPauses, g.GroupLimit(pool)).Text()
	if errors.Is(err, redis.Nil) {
		return "", ErrNotQueued
	}
	if err != nil {
		return "", fmt.Errorf("choose a stream of pool %s to pause for %s: %w", pool, waiterID, err)
	}
	if victim != "" {
		// The victim's keep-alive reads the ask within a round (up to a
		// second); the announcement reaches it in about a millisecond,
		// which an urgent class's TTFT SLO of about a second needs.
		if err := g.announce(ctx, []string{PauseTopic(victim)}); err != nil {
			return victim, err
		}
	}
	return victim, nil
}

// ErrNotQueued is Preempt's answer for a waiter that is no longer queued:
// nothing needs pausing for it.
var ErrNotQueued = errors.New("the waiter is not queued")

// PausableTopic is what a stream announces on the grant channel when it
// first may be paused since it (re)started (AnnouncePausable): an Asker
// then asks again for the waiters that found none to pause.
const PausableTopic = "pausable"

// AnnouncePausable tells every process's Asker that a stream may now be
// paused.
func (g *Gate) AnnouncePausable(ctx context.Context) error {
	return g.announce(ctx, []string{PausableTopic})
}

// PauseTopic is what Preempt announces on the grant channel for a
// stream it asked to pause (Waker.Listen): request ids are "chat-" and a
// ULID (door.NewRequestID), so a topic never wakes a waiter.
func PauseTopic(requestID string) string { return "pause:" + requestID }

// Pausable notes that requestID, streaming in pool with class rank, may
// be paused; pauses is how often it was, tokens how many it streamed
// since it last (re)started. It returns the waiter it is asked to pause
// for ("" none). Only a stream whose pool's backend can continue an
// answer calls it: no other is ever asked.
func (g *Gate) Pausable(ctx context.Context, pool, requestID string, rank, pauses, tokens int) (string, error) {
	if _, err := g.limit(pool); err != nil {
		return "", err
	}
	pausable, asked := g.pauseKeys(pool)
	waiter, err := pausableScript.Run(ctx, g.rdb, []string{g.keys(pool).permits, pausable, asked},
		requestID, rank, pauses, tokens).Text()
	if err != nil {
		return "", fmt.Errorf("note %s of pool %s as pausable: %w", requestID, pool, err)
	}
	return waiter, nil
}

// Unpausable forgets requestID's offer to be paused and any ask to
// pause, when its stream ends: a stream that crashed leaves its record
// until preempt.lua, finding it without a permit, drops it.
func (g *Gate) Unpausable(ctx context.Context, pool, requestID string) error {
	if _, err := g.limit(pool); err != nil {
		return err
	}
	pausable, asked := g.pauseKeys(pool)
	pipe := g.cmd.Pipeline()
	pipe.HDel(ctx, pausable, requestID)
	pipe.HDel(ctx, asked, requestID)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("forget %s of pool %s as pausable: %w", requestID, pool, err)
	}
	return nil
}

// Yielded is the outcome of Yield.
type Yielded struct {
	// Paused: the request gave its permit back and is queued at Seq (its
	// restore token, as Result.Seq). Not Paused and Held: nobody could
	// take the permit, which is the request's again. Neither: it held no
	// permit.
	Paused, Held bool
	Seq          int64
	// Woken are the requests granted a permit; notify them (Wake).
	Woken []Grant
}

// YieldRequest is a paused stream's request as it queues again.
type YieldRequest struct {
	ID string
	// Weight and MaxConcurrent as its Request had.
	Weight, MaxConcurrent int
	// Class as its Request had: it queues behind the entries of more
	// urgent classes.
	Class string
	// AliveFor is how long its queue place stays live without a
	// KeepAlive (0: Options.WaiterTTL).
	AliveFor time.Duration
}

// Yield gives a paused stream's permit to the waiter it was paused for
// and queues the request again at the head of the fair order, keeping
// what its output was charged. The caller stops its upstream call first,
// and notifies Woken.
func (g *Gate) Yield(ctx context.Context, pool string, req YieldRequest) (Yielded, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return Yielded{}, err
	}
	if req.Weight <= 0 {
		return Yielded{}, fmt.Errorf("yield %s in pool %s: weight must be > 0, got %d", req.ID, pool, req.Weight)
	}
	alive := req.AliveFor
	if alive <= 0 {
		alive = g.aliveTTL
	}
	k := g.keys(pool)
	pausable, asked := g.pauseKeys(pool)
	raw, err := yieldScript.Run(ctx, g.rdb, g.scriptKeys(pool), withArgs([]any{
		req.ID, limit, g.lease.Milliseconds(), k.alivePrefix, alive.Milliseconds(), req.Weight, req.MaxConcurrent,
		pausable, asked, classRank(req.Class)}, g.groupArgs(pool))...).Slice()
	if err != nil {
		return Yielded{}, fmt.Errorf("pause %s in pool %s: %w", req.ID, pool, err)
	}
	if len(raw) < 2 {
		return Yielded{}, fmt.Errorf("pause %s in pool %s: short reply %v", req.ID, pool, raw)
	}
	out := Yielded{Seq: toInt(raw[1]), Woken: toGrants(raw[2:])}
	switch toInt(raw[0]) {
	case 1:
		out.Paused = true
	case 2:
		out.Held = true
	}
	return out, nil
}

// classRank is class's rank (request.ClassRank) as the scripts take it:
// -1 for an unknown class: its entry is more urgent than no paused
// stream, and a paused stream of it queues at the head.
func classRank(class string) int {
	if rank, ok := request.ClassRank(class); ok {
		return rank
	}
	return -1
}
