// Package admission is Sluice's concurrency gate in front of the LLM pools:
// a fixed number of leased permits per pool, held in Redis so that every API
// and worker instance shares one limit, and a weighted fair queue of waiters.
//
// A permit is a lease: its holder renews it while it streams, and a crashed
// holder's permit comes back when the lease runs out. A released permit is
// handed straight to the next live waiter inside the same Lua script, so no
// slot sits idle and nobody jumps the line; the caller is told whom to wake.
//
// The queue is self-clocked fair queuing: each entry is tagged with a
// virtual finish time, start = max(pool virtual time, the tenant's last
// finish) plus cost/weight. One tenant's requests are served in arrival
// order; backlogged tenants get grants in proportion to their weights; a
// tenant's burst does not push another tenant's request behind it, and a
// tenant back from idle gets no banked credit. An entry's cost is its
// request's tokens (TokenCost), so tenants share the pool's tokens, not its
// request count: one sending long prompts does not outweigh one sending
// short ones. A tenant pays as it goes: an entry is charged what is known
// when it queues (its prompt), its stream's output is charged as it comes
// (Charge), moving the tenant's waiting entries later, and its release
// settles the rest (ReleaseUsed).
//
// A tier may cap the permits one tenant holds in a pool at once
// (Request.MaxConcurrent). A tenant at its cap keeps its entries' places
// while grants go past them to others, and its first entry is granted as
// soon as it gives one back. Every operation is one atomic script using
// Redis's clock.
package admission

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-dev/sluice/pkg/request"
)

var (
	//go:embed lua/lib.lua
	libLua string
	//go:embed lua/order.lua
	orderLua string
	//go:embed lua/enqueue.lua
	enqueueLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/renew.lua
	renewLua string
	//go:embed lua/pump.lua
	pumpLua string
	//go:embed lua/stats.lua
	statsLua string
	//go:embed lua/shed.lua
	shedLua string
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/unreserve.lua
	unreserveLua string
	//go:embed lua/ahead.lua
	aheadLua string
	//go:embed lua/charge.lua
	chargeLua string

	// prelude comes first in every script: the keys, the bookkeeping and
	// the fair order's verbs (lib.lua, then order.lua).
	prelude = libLua + orderLua

	// redis.Script runs EVALSHA and falls back to EVAL on NOSCRIPT, so a
	// Redis restart or failover that drops the script cache is harmless.
	enqueueScript   = redis.NewScript(prelude + enqueueLua)
	releaseScript   = redis.NewScript(prelude + releaseLua)
	renewScript     = redis.NewScript(prelude + renewLua)
	pumpScript      = redis.NewScript(prelude + pumpLua)
	statsScript     = redis.NewScript(prelude + statsLua)
	shedScript      = redis.NewScript(prelude + shedLua)
	aheadScript     = redis.NewScript(prelude + aheadLua)
	reserveScript   = redis.NewScript(prelude + reserveLua)
	unreserveScript = redis.NewScript(prelude + unreserveLua)
	chargeScript    = redis.NewScript(prelude + chargeLua)
)

// Status is the outcome of asking for a permit.
type Status int

const (
	// Granted: the request holds a permit.
	Granted Status = 1
	// Queued: the request waits at Result.Position.
	Queued Status = 2
	// Full: the pool's queue is at its depth cap; the request was not queued.
	Full Status = 3
	// Gone: the request already gave back what it held and can never be
	// admitted again (a late or retried call after its release).
	Gone Status = 4
	// TenantFull: the request's tenant already has Request.MaxPerTenant
	// entries in the pool's queue; the request was not queued.
	TenantFull Status = 5
	// Shed: the request was shed from the queue (Gate.Shed) and can never
	// be admitted again; like Gone, but it was turned away.
	Shed Status = 6
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
	case TenantFull:
		return "tenant_full"
	case Shed:
		return "shed"
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
	groups   map[string]*group
	alpha    float64
	tombTTL  time.Duration
	holds    HoldRecorder
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
	// MaxQueueDepth caps each pool's queue; a per-tenant cap comes with each
	// Request.
	MaxQueueDepth int
	// Limits is each pool's default permit count; a run-time override set
	// with SetLimit wins. In a group it caps the pool's share of the
	// group's budget.
	Limits map[string]int
	// Groups are pools that share backends and so one budget (Group).
	Groups []Group
	// TombstoneTTL is how long a released request id stays refused by
	// Enqueue. It must outlast any call that can still arrive for it (a
	// local activity's 20 s deadline). Default 2 minutes.
	TombstoneTTL time.Duration
	// Holds, if set, hears how long each permit was held, once per
	// permit, whichever path gives it back (HoldRecorder).
	Holds HoldRecorder
}

// HoldRecorder hears how long permits were held, from grant to release:
// told by the release that gave the permit back (Release and every
// wrapper of it, whoever calls), or, for permits whose lease ran out, by
// the Pump that claims their time. Each permit is told once across every
// instance, because the one script that drops it says whether it held.
type HoldRecorder interface {
	PermitHeld(pool string, held time.Duration)
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
	grs, err := groups(opts)
	if err != nil {
		return nil, err
	}
	return &Gate{
		rdb: rdb, cmd: rdb, prefix: opts.KeyPrefix, lease: opts.Lease, aliveTTL: opts.WaiterTTL,
		maxDepth: opts.MaxQueueDepth, limits: opts.Limits, groups: grs, alpha: 0.2, tombTTL: opts.TombstoneTTL,
		holds: opts.Holds,
	}, nil
}

// Lease is the permit lease; holders renew well before it runs out.
func (g *Gate) Lease() time.Duration { return g.lease }

func (g *Gate) limit(pool string) (int, error) {
	n, ok := g.limits[pool]
	if !ok {
		return 0, fmt.Errorf("admission: unknown pool %q", pool)
	}
	return n, nil
}

// Request is one request's ask for a permit.
type Request struct {
	// ID names the request in the pool; Enqueue is idempotent per ID.
	ID string
	// Tenant owns the request: a tenant's requests are granted in arrival
	// order, and tenants share the pool by Weight.
	Tenant string
	// Weight is the tenant's share of the pool while it has requests
	// waiting (its tier's weight, e.g. vip 5, standard 3, free 2); > 0.
	Weight int
	// Cost is the request's size in the units weights share; 0 means 1.
	// Keep a typical request near 1: the pool's virtual time has a budget
	// of about 3.6e12 units of cost/weight over its lifetime. TokenCost
	// turns a request's tokens into it.
	Cost float64
	// MaxPerTenant caps the tenant's entries in the pool's queue; beyond
	// it Enqueue answers TenantFull. 0 is no cap.
	MaxPerTenant int
	// MaxConcurrent caps the permits the tenant holds in the pool at once
	// (its tier's); 0 is no cap. A request of a tenant at its cap is
	// queued, and keeps its place while others are granted past it.
	MaxConcurrent int
	// Seq is the restore token from an earlier Result of this request, 0
	// for a new arrival: an entry that was dropped (as a zombie, when its
	// waiter missed its re-checks) comes back at its old place, past both
	// queue caps.
	Seq int64
	// Place is the place the door reserved for the request in the fair
	// order (Reserve; a zero Tag: none): a new arrival queues there, and
	// its tenant's reservation is taken whatever Enqueue answers. Only its
	// Tag and Charge are read.
	Place request.Place
	// Deadline is when the request should have its first token: its
	// arrival at the door plus its class's TTFT SLO (zero: none). A
	// tenant's own requests are granted earliest deadline first, in the
	// places the fair order gives the tenant (by_deadline in order.lua);
	// requests of one SLO keep their arrival order.
	Deadline time.Time
	// SLO is that TTFT SLO.
	SLO time.Duration
	// Class is its service class (request.Classes; "": unknown). A stream
	// paused for a more urgent request queues again behind the entries of
	// more urgent classes (Yield).
	Class string
	// AliveFor is how long the request's queue place stays live without
	// another call (0: Options.WaiterTTL). A waiter that does not re-check
	// (it waits for its grant's signal until its deadline) passes its
	// remaining wait, so that its place outlives the wait and no longer.
	AliveFor time.Duration
}

// TokensPerCost is how many tokens make one unit of Request.Cost: about
// one typical request (a prompt of a few hundred tokens and an answer of
// a few hundred more), so that the pool's virtual time lasts as the
// comment on Request.Cost says.
const TokensPerCost = 1000

// TokenCost is the Request.Cost of a request of tokens tokens (its
// prompt's bound and its max output tokens); 0 tokens is 0, the old cost
// of 1 per request.
func TokenCost(tokens int) float64 {
	if tokens <= 0 {
		return 0
	}
	return float64(tokens) / TokensPerCost
}

// Result is the state of a request after Enqueue.
type Result struct {
	Status Status
	// Position is 1-based when Queued.
	Position int
	// Seq is the entry's place in the queue (its virtual finish tag), a
	// restore token; pass it back in Request.Seq on re-checks so that a
	// dropped entry is restored to its old place. 0 when granted at once.
	Seq int64
	// Limit is the pool's effective permit count.
	Limit int
	// MeanHold is the recent mean time a permit is held.
	MeanHold time.Duration
	// Woken are other requests this call granted a permit, in this pool or
	// another of its group; notify them (Wake).
	Woken []Grant
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

// Enqueue asks for a permit for req in pool: granted at once if one is free
// and nobody waits, else queued in weighted fair order. Calling it again is
// safe and reports the current state.
func (g *Gate) Enqueue(ctx context.Context, pool string, req Request) (Result, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return Result{}, err
	}
	cost := req.Cost
	if cost == 0 {
		cost = 1
	}
	switch {
	case req.ID == "":
		return Result{}, fmt.Errorf("enqueue in pool %s: empty request id", pool)
	case req.Weight <= 0:
		return Result{}, fmt.Errorf("enqueue %s in pool %s: weight must be > 0, got %d", req.ID, pool, req.Weight)
	case !(cost > 0) || math.IsInf(cost, 0):
		return Result{}, fmt.Errorf("enqueue %s in pool %s: cost must be > 0, got %v", req.ID, pool, req.Cost)
	case req.MaxPerTenant < 0 || req.MaxConcurrent < 0 || req.Seq < 0 || req.Place.Tag < 0 || req.AliveFor < 0:
		return Result{}, fmt.Errorf("enqueue %s in pool %s: negative MaxPerTenant %d, MaxConcurrent %d, Seq %d, Place %d or AliveFor %s",
			req.ID, pool, req.MaxPerTenant, req.MaxConcurrent, req.Seq, req.Place.Tag, req.AliveFor)
	}
	alive := g.aliveTTL
	if req.AliveFor > 0 {
		alive = req.AliveFor
	}
	var deadline int64
	if !req.Deadline.IsZero() {
		deadline = req.Deadline.UnixMilli()
	}
	k := g.keys(pool)
	raw, err := enqueueScript.Run(ctx, g.rdb, g.scriptKeys(pool), withArgs([]any{
		req.ID, req.Tenant, req.Weight, strconv.FormatFloat(cost, 'g', -1, 64), req.MaxPerTenant, req.Seq,
		limit, g.lease.Milliseconds(), g.maxDepth, alive.Milliseconds(), k.alivePrefix, k.tombPrefix, req.MaxConcurrent, req.Place.Tag, req.Place.Charge,
		req.Place.Shift, deadline, req.SLO.Milliseconds(), classRank(req.Class),
	}, g.groupArgs(pool))...).Slice()
	if err != nil {
		return Result{}, fmt.Errorf("enqueue %s in pool %s: %w", req.ID, pool, err)
	}
	if len(raw) < 5 {
		return Result{}, fmt.Errorf("enqueue %s in pool %s: short reply %v", req.ID, pool, raw)
	}
	return Result{
		Status:   Status(toInt(raw[0])),
		Position: int(toInt(raw[1])),
		Seq:      toInt(raw[2]),
		Limit:    int(toInt(raw[3])),
		MeanHold: time.Duration(toInt(raw[4])) * time.Millisecond,
		Woken:    toGrants(raw[5:]),
	}, nil
}

// Released says what Release gave back.
type Released struct {
	HeldPermit bool
	// Held is how long the permit was held, from its grant (0: none was,
	// or its grant time is unknown).
	Held      time.Duration
	WasQueued bool
	Woken     []Grant
}

// Release gives back requestID's permit or queue place in pool. It is
// idempotent: a second call finds nothing and frees nothing.
func (g *Gate) Release(ctx context.Context, pool, requestID string) (Released, error) {
	return g.ReleaseUsed(ctx, pool, requestID, 0)
}

// ReleaseUsed is Release of a request that used cost (TokenCost of its
// prompt and answer tokens as served; 0: unknown): if it held a permit
// it was queued for, what it used beyond what it was charged (at its
// place and while it streamed, Charge) is charged to its tenant as a
// stream's output is, and what it was charged beyond what it used is
// the tenant's credit; once, with the permit.
func (g *Gate) ReleaseUsed(ctx context.Context, pool, requestID string, cost float64) (Released, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return Released{}, err
	}
	if !(cost >= 0) || math.IsInf(cost, 0) {
		return Released{}, fmt.Errorf("release %s in pool %s: used cost must be >= 0, got %v", requestID, pool, cost)
	}
	k := g.keys(pool)
	raw, err := releaseScript.Run(ctx, g.rdb, g.scriptKeys(pool), withArgs([]any{
		requestID, limit, g.lease.Milliseconds(), k.alivePrefix, strconv.FormatFloat(g.alpha, 'f', -1, 64),
		k.tombPrefix, g.tombTTL.Milliseconds(), strconv.FormatFloat(cost, 'g', -1, 64),
	}, g.groupArgs(pool))...).Slice()
	if err != nil {
		return Released{}, fmt.Errorf("release %s in pool %s: %w", requestID, pool, err)
	}
	if len(raw) < 3 {
		return Released{}, fmt.Errorf("release %s in pool %s: short reply %v", requestID, pool, raw)
	}
	rel := Released{
		HeldPermit: toInt(raw[0]) == 1, WasQueued: toInt(raw[1]) == 1,
		Held: time.Duration(toInt(raw[2])) * time.Millisecond, Woken: toGrants(raw[3:]),
	}
	g.heard(pool, rel.Held)
	return rel, nil
}

// heard tells the HoldRecorder of a permit held for held.
func (g *Gate) heard(pool string, held time.Duration) {
	if g.holds != nil && held > 0 {
		g.holds.PermitHeld(pool, held)
	}
}

// Renew extends requestID's lease; false means the permit was lost.
func (g *Gate) Renew(ctx context.Context, pool, requestID string) (bool, error) {
	k := g.keys(pool)
	n, err := renewScript.Run(ctx, g.rdb, k.list()[:2], requestID, g.lease.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("renew permit of %s in pool %s: %w", requestID, pool, err)
	}
	return n == 1, nil
}

// KeepAlive keeps a queued request's place live for d from now, for a
// waiter that will re-check less often than the gate's WaiterTTL assumes
// (each Enqueue resets it to WaiterTTL). A request no longer queued is
// left alone.
func (g *Gate) KeepAlive(ctx context.Context, pool, requestID string, d time.Duration) error {
	if err := g.cmd.PExpire(ctx, g.keys(pool).alivePrefix+requestID, d).Err(); err != nil {
		return fmt.Errorf("keep %s alive in pool %s: %w", requestID, pool, err)
	}
	return nil
}

// AliveFor is how long a waiter's place must stay live when it re-checks
// every recheck: three missed re-checks, and some slack, make it a zombie.
func AliveFor(recheck time.Duration) time.Duration {
	return max(3*recheck+5*time.Second, 15*time.Second)
}

// Pump reclaims expired permits and grants free ones to waiters (of the
// pool's group too), returning whom it granted. The time the pool's
// expired permits were held goes to the HoldRecorder.
func (g *Gate) Pump(ctx context.Context, pool string) ([]Grant, error) {
	limit, err := g.limit(pool)
	if err != nil {
		return nil, err
	}
	k := g.keys(pool)
	raw, err := pumpScript.Run(ctx, g.rdb, g.scriptKeys(pool), withArgs([]any{
		limit, g.lease.Milliseconds(), k.alivePrefix}, g.groupArgs(pool))...).Slice()
	if err != nil {
		return nil, fmt.Errorf("pump pool %s: %w", pool, err)
	}
	if len(raw) < 1 {
		return nil, fmt.Errorf("pump pool %s: empty reply", pool)
	}
	g.heard(pool, time.Duration(toInt(raw[0]))*time.Millisecond)
	return toGrants(raw[1:]), nil
}

// Shed removes the waiting requests of the lowest weight (the lowest
// tier) queued in pool, the newest first, and returns their ids; the
// caller tells each one. It is atomic, and each shed request is
// tombstoned so that its later re-checks answer Shed rather than queue it
// again.
//
// Unless at least two distinct weights wait, it sheds nothing: shedding
// protects the higher tiers from a lower one, and with one tier waiting
// it would only empty the queue. Permits in use are never touched.
func (g *Gate) Shed(ctx context.Context, pool string, opts ShedOptions) (ShedResult, error) {
	if _, err := g.limit(pool); err != nil {
		return ShedResult{}, err
	}
	if opts.Max < 0 {
		return ShedResult{}, fmt.Errorf("shed pool %s: max must be >= 0, got %d", pool, opts.Max)
	}
	k := g.keys(pool)
	done := ""
	if opts.Key != "" {
		done = k.shedPrefix + opts.Key
	}
	raw, err := shedScript.Run(ctx, g.rdb, g.scriptKeys(pool), k.alivePrefix, k.tombPrefix, g.tombTTL.Milliseconds(), opts.Max, done).Slice()
	if err != nil {
		return ShedResult{}, fmt.Errorf("shed pool %s: %w", pool, err)
	}
	if len(raw) < 1 {
		return ShedResult{}, fmt.Errorf("shed pool %s: empty reply", pool)
	}
	return ShedResult{Weight: int(toInt(raw[0])), IDs: toStrings(raw[1:])}, nil
}

// ShedOptions bound one Shed.
type ShedOptions struct {
	// Max is the most requests shed (0: every waiter of the lowest weight).
	Max int
	// Key, if set, makes the shed idempotent for as long as a tombstone
	// lasts: a Shed with a key already used answers what the first did and
	// sheds nothing more (a retried activity must not shed the next tier).
	Key string
}

// ShedResult is what Shed removed.
type ShedResult struct {
	// Weight is the weight shed; 0 when nothing was.
	Weight int
	IDs    []string
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
