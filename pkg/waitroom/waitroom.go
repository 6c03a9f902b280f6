// Package waitroom is the door's waiting room. A request that cannot start
// its workflow yet — every start slot of its API process is in use, or its
// pool's admission queue already holds as many requests as it can usefully
// hold — waits here, in the API process, where waiting costs Temporal
// nothing. Waiters leave in weighted fair order across tenants (self-clocked
// fair queuing by tier weight and each request's size in tokens, first come
// first served within a tenant), one pool at a time, as start slots free up
// and their pool can take them.
//
// Why a room at the door: a workflow that waits in the admission queue
// costs Temporal a timer, a signal and a workflow task more than one that
// is admitted at once, and Temporal is the scarce resource of a gateway
// under overload. Keeping the admission queue short and the rest of the
// crowd here keeps what a served request costs flat however many wait.
package waitroom

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// Ticket says who waits, for which pool.
type Ticket struct {
	Pool   string
	Tenant string
	// Weight is the tenant's share while it has waiters (its tier's
	// weight); > 0.
	Weight int
	// Cost is the request's size in the units weights share: its tokens,
	// as admission counts them (admission.TokenCost), so that the room
	// hands out tokens fairly, as the admission queue behind it does. 0
	// means 1.
	Cost float64
	// MaxPerTenant caps the tenant's waiters in the room (0: none).
	MaxPerTenant int
	// Pass: the pool's fair order would put the request within its
	// queue's bound although the queue is full (a heavy tier's request,
	// or a light tenant's among backlogged ones). It takes a free start
	// slot past the line, unless its tenant has waiters here, whose order
	// it keeps. Without it the request would wait here behind entries the
	// queue then puts behind it: a permit turnover lost for nothing.
	Pass bool
	// Tag, if not 0, is the request's place in its pool's fair order,
	// reserved in the admission queue's order (admission.Gate.Reserve): the
	// line orders by it, so that the room and the queue are one order. 0:
	// the room places it by its own clock.
	Tag int64
	// Shift is its tenant's shift when Tag was reserved: a tagged waiter
	// lines up at Tag moved on by what its tenant's streams were charged
	// since (Options.Shifts), as the queue will place it.
	Shift int64
	// Charge is the ticks of virtual time the place at Tag was charged
	// (request.Place.Charge): it goes with the place when waiters swap
	// places (Waiter.Place).
	Charge int64
	// Deadline is when the request should have its first token: its
	// arrival plus its class's TTFT SLO, SLO (zero: none). A tenant's own
	// waiters in a line leave earliest deadline first, in the places its
	// waiters hold; waiters of one SLO keep their arrival order.
	Deadline time.Time
	SLO      time.Duration
}

// Shifts reads each tenant's shift in pool's fair order now: how far
// its streams' charges have moved its places since it was last idle
// (admission.Gate.Shifts).
type Shifts func(ctx context.Context, pool string) (map[string]int64, error)

// Ready reports whether pool's admission queue can take another request
// now, given that starting more are already on their way to it.
type Ready func(ctx context.Context, pool string, starting int) (bool, error)

// Options configures a Room.
type Options struct {
	// Slots bounds the workflow starts in flight at once; > 0.
	Slots int
	// Capacity bounds the waiters at once; beyond it Enter refuses.
	Capacity int
	// Ready is asked before a waiter leaves for its pool; nil: always.
	Ready Ready
	// Shifts, if set, is read before a pool's head leaves while tagged
	// waiters wait for it, and moves them as their tenants were charged.
	Shifts Shifts
	// Poll is how soon a pool that was not ready is asked again.
	Poll   time.Duration
	Logger *slog.Logger
}

// Errors Enter refuses with.
var (
	ErrFull       = errors.New("waiting room full")
	ErrTenantFull = errors.New("the tenant's share of the waiting room is full")
)

// Room is one API process's waiting room. Run must be running for waiters
// to be admitted.
type Room struct {
	opts Options
	wake chan struct{}

	mu      sync.Mutex
	free    int
	waiting int
	lines   map[string]*line
	tenants map[string]int
	// starting counts, per pool, the admitted requests whose start is in
	// flight: on their way to the pool's queue but not in it yet.
	starting map[string]int
	seq      uint64
}

// New returns a Room.
func New(opts Options) (*Room, error) {
	if opts.Slots <= 0 || opts.Capacity < 0 {
		return nil, fmt.Errorf("waiting room: Slots must be > 0 and Capacity >= 0, got %d and %d", opts.Slots, opts.Capacity)
	}
	if opts.Poll <= 0 {
		opts.Poll = 50 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Room{
		opts: opts, wake: make(chan struct{}, 1), free: opts.Slots,
		lines: map[string]*line{}, tenants: map[string]int{}, starting: map[string]int{},
	}, nil
}

// Waiter is one request in the room, or one holding a start slot.
type Waiter struct {
	room     *Room
	ticket   Ticket
	tag      float64
	seq      uint64
	index    int
	admitted chan struct{}
	state    state
}

type state int

const (
	waiting state = iota
	holding
	gone
)

// Admits reports whether Enter would admit a request for pool at once,
// its pool ready: a start slot is free and nobody waits for the pool.
func (r *Room) Admits(pool string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.free > 0 && r.line(pool).Len() == 0
}

// Enter admits t at once when a start slot is free, nobody waits for its
// pool (or t passes them: Ticket.Pass) and ready (the caller's own read of
// the pool's queue) says the pool can take it; otherwise t waits. It refuses with ErrFull or ErrTenantFull
// when the room, or the tenant's share of it, is full. The caller must
// call Leave once: after the start, or when it gives up waiting.
func (r *Room) Enter(t Ticket, ready bool) (*Waiter, error) {
	if t.Weight <= 0 {
		return nil, fmt.Errorf("enter waiting room for pool %s: weight must be > 0, got %d", t.Pool, t.Weight)
	}
	if t.Cost < 0 || math.IsNaN(t.Cost) || math.IsInf(t.Cost, 0) {
		return nil, fmt.Errorf("enter waiting room for pool %s: cost must be >= 0, got %v", t.Pool, t.Cost)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := &Waiter{room: r, ticket: t, admitted: make(chan struct{})}
	l := r.line(t.Pool)
	if ready && r.free > 0 && (l.Len() == 0 || t.Pass && r.tenants[t.Tenant] == 0) {
		r.hold(w)
		return w, nil
	}
	switch {
	case r.waiting >= r.opts.Capacity:
		return nil, ErrFull
	case t.MaxPerTenant > 0 && r.tenants[t.Tenant] >= t.MaxPerTenant:
		return nil, ErrTenantFull
	}
	r.seq++
	w.seq = r.seq
	cost := t.Cost
	if cost == 0 {
		cost = 1
	}
	w.tag = max(l.vtime, l.finish[t.Tenant]) + cost/float64(t.Weight)
	if t.Tag != 0 {
		w.tag = float64(t.Tag)
	}
	l.finish[t.Tenant] = w.tag
	heap.Push(l, w)
	if r.tenants[t.Tenant] > 0 {
		l.dealByDeadline(w)
	}
	l.changed++
	r.waiting++
	r.tenants[t.Tenant]++
	r.nudge()
	return w, nil
}

// Admitted is closed when the waiter holds a start slot.
func (w *Waiter) Admitted() <-chan struct{} { return w.admitted }

// Position is the waiter's 1-based place in its pool's line; 0 once it is
// admitted or gone.
func (w *Waiter) Position() int {
	r := w.room
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.state != waiting {
		return 0
	}
	return r.lines[w.ticket.Pool].position(w)
}

// Started gives back the start slot of a waiter whose workflow started,
// and keeps counting it as starting toward its pool until settled is
// closed (its request reached the pool's queue or a permit) or within has
// passed: a started request reaches its pool's queue only with its first
// workflow task, and until then Ready would not see it. Counting it until
// it is there, not for a fixed time, keeps the next request of the line
// from starting early and reaching the queue first, which on a slow
// worker would serve a tenant's requests out of their order. Calling
// Leave after it does nothing.
func (w *Waiter) Started(settled <-chan struct{}, within time.Duration) {
	r := w.room
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.state != holding {
		return
	}
	w.state = gone
	r.free++
	r.nudge()
	go func() {
		t := time.NewTimer(within)
		defer t.Stop()
		select {
		case <-settled:
		case <-t.C:
		}
		r.mu.Lock()
		r.starting[w.ticket.Pool]--
		r.mu.Unlock()
		r.nudge()
	}()
}

// Leave gives back the waiter's start slot, or its place in the line if
// it was not admitted yet. Calling it again does nothing.
func (w *Waiter) Leave() {
	r := w.room
	r.mu.Lock()
	defer r.mu.Unlock()
	switch w.state {
	case waiting:
		l := r.lines[w.ticket.Pool]
		heap.Remove(l, w.index)
		l.changed++
		r.waiting--
		r.leaveTenant(w.ticket.Tenant)
	case holding:
		r.free++
		r.starting[w.ticket.Pool]--
		r.nudge()
	}
	w.state = gone
}

// Stats is what the room holds now.
type Stats struct {
	Waiting, Starting int
}

// Stats reports the waiters and the starts in flight.
func (r *Room) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Stats{Waiting: r.waiting, Starting: r.opts.Slots - r.free}
}

// Run admits waiters until ctx ends: whenever a start slot is free, the
// head of each pool's line leaves once Ready says its pool can take it.
func (r *Room) Run(ctx context.Context) {
	poll := time.NewTimer(r.opts.Poll)
	defer poll.Stop()
	for {
		blocked := r.dispatch(ctx)
		var retry <-chan time.Time
		if blocked {
			poll.Reset(r.opts.Poll)
			retry = poll.C
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-retry:
		}
	}
}

// dispatch admits waiters while slots are free and their pools are ready.
// It reports whether a pool with waiters was not ready (to ask again).
func (r *Room) dispatch(ctx context.Context) (blocked bool) {
	for {
		admitted := false
		for _, pool := range r.poolsWaiting() {
			ok, err := r.ready(ctx, pool)
			if err != nil {
				r.opts.Logger.Warn("waiting room: ask whether the pool can take more; asking again", "pool", pool, "err", err)
			}
			if !ok {
				blocked = true
				continue
			}
			r.retag(ctx, pool)
			if r.admitHead(pool) {
				admitted = true
			}
		}
		if !admitted {
			return blocked
		}
		blocked = false
	}
}

// poolsWaiting lists the pools with waiters, if a slot is free.
func (r *Room) poolsWaiting() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.free == 0 {
		return nil
	}
	var pools []string
	for name, l := range r.lines {
		if l.Len() > 0 {
			pools = append(pools, name)
		}
	}
	return pools
}

func (r *Room) ready(ctx context.Context, pool string) (bool, error) {
	if r.opts.Ready == nil {
		return true, nil
	}
	r.mu.Lock()
	starting := r.starting[pool]
	r.mu.Unlock()
	return r.opts.Ready(ctx, pool, starting)
}

// retag moves pool's tagged waiters to their tags as the pool's queue
// would place them now: the reserved tag moved on by what each tenant's
// streams were charged since it was reserved. A read that fails leaves
// the line as it was.
func (r *Room) retag(ctx context.Context, pool string) {
	if r.opts.Shifts == nil || !r.hasTagged(pool) {
		return
	}
	shifts, err := r.opts.Shifts(ctx, pool)
	if err != nil {
		r.opts.Logger.Warn("waiting room: read the tenants' shifts; keeping the line's order", "pool", pool, "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.line(pool)
	for _, w := range l.waiters {
		if w.ticket.Tag != 0 {
			w.tag = float64(w.ticket.Tag + max(0, shifts[w.ticket.Tenant]-w.ticket.Shift))
		}
	}
	heap.Init(l)
	l.changed++
}

// hasTagged reports whether a waiter of pool's line has a reserved tag.
func (r *Room) hasTagged(pool string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.line(pool).waiters {
		if w.ticket.Tag != 0 {
			return true
		}
	}
	return false
}

// admitHead gives a free slot to the head of pool's line, if both exist.
func (r *Room) admitHead(pool string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lines[pool]
	if r.free == 0 || l.Len() == 0 {
		return false
	}
	w := heap.Pop(l).(*Waiter)
	l.changed++
	// The line's virtual time moves to the tag of whom it serves, so a
	// tenant back from idle starts level with the others, banking nothing.
	l.vtime = w.tag
	r.waiting--
	r.leaveTenant(w.ticket.Tenant)
	r.hold(w)
	return true
}

// hold gives w a start slot. r.mu is held.
func (r *Room) hold(w *Waiter) {
	r.free--
	r.starting[w.ticket.Pool]++
	w.state = holding
	close(w.admitted)
}

func (r *Room) leaveTenant(tenant string) {
	if r.tenants[tenant]--; r.tenants[tenant] <= 0 {
		delete(r.tenants, tenant)
	}
}

func (r *Room) nudge() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// line returns pool's line, creating it. r.mu is held.
func (r *Room) line(pool string) *line {
	l := r.lines[pool]
	if l == nil {
		l = &line{finish: map[string]float64{}}
		r.lines[pool] = l
	}
	return l
}
