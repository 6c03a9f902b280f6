// Package admission is Sluice's concurrency gate in front of the LLM pools:
// a fixed number of leased permits per pool, held in Redis so that every API
// and worker instance shares one limit, and a FIFO queue of waiters.
//
// A permit is a lease: its holder renews it while it streams, and a crashed
// holder's permit comes back when the lease runs out. A released permit is
// handed straight to the next live waiter inside the same Lua script, so no
// slot sits idle and nobody jumps the line; the caller is told whom to wake.
// Every operation is one atomic script using Redis's clock.
package admission

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/lib.lua
	libLua string
	//go:embed lua/enqueue.lua
	enqueueLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/renew.lua
	renewLua string
	//go:embed lua/pump.lua
	pumpLua string

	// redis.Script runs EVALSHA and falls back to EVAL on NOSCRIPT, so a
	// Redis restart or failover that drops the script cache is harmless.
	enqueueScript = redis.NewScript(libLua + enqueueLua)
	releaseScript = redis.NewScript(libLua + releaseLua)
	renewScript   = redis.NewScript(libLua + renewLua)
	pumpScript    = redis.NewScript(libLua + pumpLua)
)

// Status is the outcome of asking for a permit.
type Status int

const (
	// Granted: the request holds a permit.
	Granted Status = 1
	// Queued: the request waits at Result.Position.
	Queued Status = 2
	// Full: the queue is at its depth cap; the request was not queued.
	Full Status = 3
	// Gone: the request already gave back what it held and can never be
	// admitted again (a late or retried call after its release).
	Gone Status = 4
)

func (s Status) String() string {
	switch s {
	case Granted:
		return "granted"
	case Queued:
		return "queued"
	case Full:
		return "full"
	case Gone:
		return "gone"
	}
	return "unknown"
}

// Gate is the admission gate of all pools.
type Gate struct {
	rdb      redis.Scripter
	cmd      redis.Cmdable
	prefix   string
	lease    time.Duration
	aliveTTL time.Duration
	maxDepth int
	limits   map[string]int
	alpha    float64
	tombTTL  time.Duration
}

// Options configures a Gate.
type Options struct {
	// KeyPrefix namespaces every key ("sluice:").
	KeyPrefix string
	// Lease is a permit's lifetime without renewal.
	Lease time.Duration
	// WaiterTTL is how long a waiter's queue entry stays live without a
	// re-check; after that it is dropped as a zombie when it reaches the
	// head. It must exceed the waiters' re-check interval.
	WaiterTTL time.Duration
	// MaxQueueDepth caps each pool's queue.
	MaxQueueDepth int
	// Limits is each pool's default permit count; a run-time override set
	// with SetLimit wins.
	Limits map[string]int
	// TombstoneTTL is how long a released request id stays refused by
	// Enqueue. It must outlast any call that can still arrive for it (a
	// local activity's 20 s deadline). Default 2 minutes.
	TombstoneTTL time.Duration
}

// Client is the part of go-redis the gate needs; *redis.Client,
// *redis.ClusterClient and *redis.Ring all satisfy it.
type Client interface {
	redis.Scripter
	redis.Cmdable
}

// New returns a Gate.
func New(rdb Client, opts Options) (*Gate, error) {
	if opts.Lease <= 0 || opts.WaiterTTL <= 0 || opts.MaxQueueDepth <= 0 || len(opts.Limits) == 0 {
		return nil, errors.New("admission: Lease, WaiterTTL, MaxQueueDepth and Limits must be set")
	}
	for pool, n := range opts.Limits {
		if n <= 0 {
			return nil, fmt.Errorf("admission: pool %q limit must be > 0, got %d", pool, n)
		}
	}
	if opts.TombstoneTTL <= 0 {
		opts.TombstoneTTL = 2 * time.Minute
	}
	return &Gate{
		rdb: rdb, cmd: rdb, prefix: opts.KeyPrefix, lease: opts.Lease, aliveTTL: opts.WaiterTTL,
		maxDepth: opts.MaxQueueDepth, limits: opts.Limits, alpha: 0.2, tombTTL: opts.TombstoneTTL,
	}, nil
}

// Lease is the permit lease; holders renew well before it runs out.
func (g *Gate) Lease() time.Duration { return g.lease }

type poolKeys struct {
	permits, grants, queue, seq, stats, alivePrefix, tombPrefix string
}

// keys share the hash tag {pool} so that one pool's keys live in one
// Redis Cluster slot, as a multi-key script requires.
func (g *Gate) keys(pool string) poolKeys {
	base := g.prefix + "adm:{" + pool + "}:"
	return poolKeys{
		permits: base + "permits", grants: base + "grants", queue: base + "queue",
		seq: base + "seq", stats: base + "stats", alivePrefix: base + "alive:", tombPrefix: base + "released:",
	}
}

func (g *Gate) limit(pool string) (int, error) {
	n, ok := g.limits[pool]
	if !ok {
		return 0, fmt.Errorf("admission: unknown pool %q", pool)
	}
	return n, nil
}

// Result is the state of a request after Enqueue.
type Result struct {
	Status Status
	// Position is 1-based when Queued.
	Position int
	// Seq is the arrival sequence; pass it back to Enqueue on re-checks so
	// that a dropped entry is restored to its old place.
	Seq int64
	// Limit is the pool's effective permit count.
	Limit int
	// MeanHold is the recent mean time a permit is held.
	MeanHold time.Duration
	// Woken are other requests this call granted a permit; notify them.
	Woken []string
}

// EstimatedWait is the expected wait at Position: Limit permits turn over
// once per MeanHold, so the queue advances Limit places per MeanHold.
func (r Result) EstimatedWait() time.Duration {
	return EstimateWait(r.Position, r.Limit, r.MeanHold)
}

// EstimateWait estimates the wait of the waiter at position.
func EstimateWait(position, limit int, meanHold time.Duration) time.Duration {
	if position <= 0 || limit <= 0 {
		return 0
	}
	return time.Duration(int64(meanHold) * int64(position) / int64(limit))
}

// Enqueue asks for a permit for requestID in pool: granted at once if one is
// free and nobody waits, else queued FIFO. Calling it again is safe and
// reports the current state; seq (0 for a new arrival) restores a dropped
// entry to its old place.
func (g *Gate) Enqueue(ctx context.Context, pool, requestID string, seq int64) (Result, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return Result{}, err
	}
	k := g.keys(pool)
	raw, err := enqueueScript.Run(ctx, g.rdb,
		[]string{k.permits, k.grants, k.queue, k.seq, k.stats},
		requestID, limit, g.lease.Milliseconds(), g.maxDepth, g.aliveTTL.Milliseconds(), k.alivePrefix, seq, k.tombPrefix,
	).Slice()
	if err != nil {
		return Result{}, fmt.Errorf("enqueue %s in pool %s: %w", requestID, pool, err)
	}
	if len(raw) < 5 {
		return Result{}, fmt.Errorf("enqueue %s in pool %s: short reply %v", requestID, pool, raw)
	}
	return Result{
		Status:   Status(toInt(raw[0])),
		Position: int(toInt(raw[1])),
		Seq:      toInt(raw[2]),
		Limit:    int(toInt(raw[3])),
		MeanHold: time.Duration(toInt(raw[4])) * time.Millisecond,
		Woken:    toStrings(raw[5:]),
	}, nil
}

// Released says what Release gave back.
type Released struct {
	HeldPermit bool
	WasQueued  bool
	Woken      []string
}

// Release gives back requestID's permit or queue place in pool. It is
// idempotent: a second call finds nothing and frees nothing.
func (g *Gate) Release(ctx context.Context, pool, requestID string) (Released, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return Released{}, err
	}
	k := g.keys(pool)
	raw, err := releaseScript.Run(ctx, g.rdb,
		[]string{k.permits, k.grants, k.queue, k.stats},
		requestID, limit, g.lease.Milliseconds(), k.alivePrefix, strconv.FormatFloat(g.alpha, 'f', -1, 64),
		k.tombPrefix, g.tombTTL.Milliseconds(),
	).Slice()
	if err != nil {
		return Released{}, fmt.Errorf("release %s in pool %s: %w", requestID, pool, err)
	}
	if len(raw) < 2 {
		return Released{}, fmt.Errorf("release %s in pool %s: short reply %v", requestID, pool, raw)
	}
	return Released{HeldPermit: toInt(raw[0]) == 1, WasQueued: toInt(raw[1]) == 1, Woken: toStrings(raw[2:])}, nil
}

// Renew extends requestID's lease; false means the permit was lost.
func (g *Gate) Renew(ctx context.Context, pool, requestID string) (bool, error) {
	k := g.keys(pool)
	n, err := renewScript.Run(ctx, g.rdb, []string{k.permits, k.grants}, requestID, g.lease.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("renew permit of %s in pool %s: %w", requestID, pool, err)
	}
	return n == 1, nil
}

// Pump reclaims expired permits and grants free ones to waiters, returning
// whom it granted.
func (g *Gate) Pump(ctx context.Context, pool string) ([]string, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return nil, err
	}
	k := g.keys(pool)
	raw, err := pumpScript.Run(ctx, g.rdb, []string{k.permits, k.grants, k.queue, k.stats},
		limit, g.lease.Milliseconds(), k.alivePrefix).Slice()
	if err != nil {
		return nil, fmt.Errorf("pump pool %s: %w", pool, err)
	}
	return toStrings(raw), nil
}

// Position returns requestID's 1-based queue position, or ok=false if it is
// not queued (granted, gone, or never there).
func (g *Gate) Position(ctx context.Context, pool, requestID string) (int, bool, error) {
	rank, err := g.cmd.ZRank(ctx, g.keys(pool).queue, requestID).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("queue position of %s in pool %s: %w", requestID, pool, err)
	}
	return int(rank) + 1, true, nil
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

// SetLimit overrides a pool's permit count for every instance at once.
// Lowering it never revokes held permits; it only stops new grants until
// usage falls below the new limit.
func (g *Gate) SetLimit(ctx context.Context, pool string, n int) error {
	if _, err := g.limit(pool); err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("set limit of pool %s: must be > 0, got %d", pool, n)
	}
	if err := g.cmd.HSet(ctx, g.keys(pool).stats, "limit", n).Err(); err != nil {
		return fmt.Errorf("set limit of pool %s: %w", pool, err)
	}
	return nil
}

// Pools lists the configured pools.
func (g *Gate) Pools() []string {
	out := make([]string, 0, len(g.limits))
	for p := range g.limits {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toStrings(vs []any) []string {
	if len(vs) == 0 {
		return nil
	}
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
