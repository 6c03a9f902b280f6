package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hub multiplexes every SSE reader of one process onto a few blocking
// XREAD calls, one per stream group that has readers, instead of holding
// one Redis connection per open stream. One XREAD reads keys of one group
// only, since on Redis Cluster a call's keys must share a slot. A new
// subscriber interrupts its group's blocked XREAD by writing to the
// group's wake stream (this Hub's own, in the group's slot), so it is
// served at once.
type Hub struct {
	rdb    redis.UniversalClient
	log    *Log
	logger *slog.Logger
	block  time.Duration
	count  int64
	maxBuf int
	groups []*group
}

// HubOptions configures a Hub.
type HubOptions struct {
	// Block is how long one XREAD blocks; it bounds shutdown time.
	Block time.Duration
	// MaxBuffered events per subscriber before it is cut off as too slow
	// (the client can resume with Last-Event-ID).
	MaxBuffered int
	Logger      *slog.Logger
}

// group is the Hub's reader of one stream group.
type group struct {
	wakeKey string
	// readers receives when a subscriber joins, to start an idle reader.
	readers chan struct{}
	mu      sync.Mutex
	subs    map[string]map[*Subscription]struct{}
	stopped bool
}

// NewHub returns a Hub reading streams written through log. Call Run.
func NewHub(rdb redis.UniversalClient, log *Log, opts HubOptions) *Hub {
	if opts.Block <= 0 {
		opts.Block = 2 * time.Second
	}
	if opts.MaxBuffered <= 0 {
		opts.MaxBuffered = 10000
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	h := &Hub{rdb: rdb, log: log, logger: opts.Logger, block: opts.Block, count: 512, maxBuf: opts.MaxBuffered}
	instance := strconv.FormatInt(time.Now().UnixNano(), 36)
	for g := range streamGroups {
		h.groups = append(h.groups, &group{
			wakeKey: log.wakeKey(g, instance),
			readers: make(chan struct{}, 1),
			subs:    map[string]map[*Subscription]struct{}{},
		})
	}
	return h
}

// Run serves subscribers until ctx ends; then every open subscription
// gets ErrClosed.
func (h *Hub) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, g := range h.groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.runGroup(ctx, g)
		}()
	}
	wg.Wait()
	return nil
}

// runGroup reads a group's streams while it has subscribers, and holds
// no connection while it has none.
func (h *Hub) runGroup(ctx context.Context, g *group) {
	defer g.closeAll(ErrClosed)
	defer h.rdb.Del(context.Background(), g.wakeKey)
	// The wake cursor is a concrete entry, not "$": a wake written between
	// two XREADs must still be seen by the next one.
	var wakeCursor string
	for g.awaitReaders(ctx) {
		if wakeCursor == "" {
			c, err := h.wake(ctx, g)
			if err != nil {
				h.logger.Warn("event hub cannot reach redis", "err", err)
				sleepCtx(ctx, 200*time.Millisecond)
				continue
			}
			wakeCursor = c
		}
		streams, starts := g.snapshot(wakeCursor)
		if len(starts) == 0 {
			continue
		}
		res, err := h.rdb.XRead(ctx, &redis.XReadArgs{Streams: streams, Count: h.count, Block: h.block}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			h.logger.Warn("event hub read failed", "err", err)
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		for _, st := range res {
			if st.Stream == g.wakeKey {
				if n := len(st.Messages); n > 0 {
					wakeCursor = st.Messages[n-1].ID
				}
				continue
			}
			g.deliver(st.Stream, starts[st.Stream], decode(st.Messages), h.maxBuf)
		}
	}
}

// awaitReaders waits until the group has a subscriber; false when ctx
// ended first.
func (g *group) awaitReaders(ctx context.Context) bool {
	for ctx.Err() == nil {
		g.mu.Lock()
		n := len(g.subs)
		g.mu.Unlock()
		if n > 0 {
			return true
		}
		select {
		case <-ctx.Done():
		case <-g.readers:
		}
	}
	return false
}

func (h *Hub) wake(ctx context.Context, g *group) (string, error) {
	pipe := h.rdb.Pipeline()
	add := pipe.XAdd(ctx, &redis.XAddArgs{Stream: g.wakeKey, MaxLen: 16, Approx: true, Values: []any{"w", 1}})
	pipe.PExpire(ctx, g.wakeKey, time.Hour)
	if _, err := pipe.Exec(ctx); err != nil {
		return "", fmt.Errorf("wake event hub reader: %w", err)
	}
	return add.Val(), nil
}

// Subscribe delivers the events of requestID after afterID ("" or "0" for
// all) until the subscription is closed. Close it when done.
func (h *Hub) Subscribe(ctx context.Context, requestID, afterID string) (*Subscription, error) {
	if afterID == "" {
		afterID = "0-0"
	}
	key := h.log.Key(requestID)
	g := h.groups[groupOf(requestID)]
	sub := &Subscription{hub: h, group: g, key: key, cursor: afterID, notify: make(chan struct{}, 1)}
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return nil, ErrClosed
	}
	if g.subs[key] == nil {
		g.subs[key] = map[*Subscription]struct{}{}
	}
	g.subs[key][sub] = struct{}{}
	g.mu.Unlock()
	select {
	case g.readers <- struct{}{}:
	default:
	}
	// The wake only shortens the wait for the group's next read (which
	// would otherwise come when its XREAD times out), so the caller need
	// not wait for it.
	go func() {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := h.wake(wctx, g); err != nil {
			h.logger.Warn("wake event hub reader", "err", err)
		}
	}()
	return sub, nil
}

// snapshot returns the XREAD arguments — each stream read from the lowest
// cursor of its readers — and that start cursor per stream.
func (g *group) snapshot(wakeCursor string) ([]string, map[string]string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	keys := make([]string, 0, len(g.subs)+1)
	ids := make([]string, 0, len(g.subs)+1)
	starts := make(map[string]string, len(g.subs))
	keys = append(keys, g.wakeKey)
	ids = append(ids, wakeCursor)
	for key, subs := range g.subs {
		var min string
		for sub := range subs {
			c := sub.cursorID()
			if min == "" || compareIDs(c, min) < 0 {
				min = c
			}
		}
		keys = append(keys, key)
		ids = append(ids, min)
		starts[key] = min
	}
	return append(keys, ids...), starts
}

// deliver hands a batch read from start to the stream's readers. A reader
// whose cursor is below start joined while the read was in flight: the
// batch does not cover what it still needs, so it waits for the next read,
// which starts from its cursor.
func (g *group) deliver(key, start string, evs []Event, maxBuf int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for sub := range g.subs[key] {
		if start == "" || compareIDs(sub.cursorID(), start) < 0 {
			continue
		}
		sub.push(evs, maxBuf)
	}
}

func (g *group) remove(sub *Subscription) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if subs := g.subs[sub.key]; subs != nil {
		delete(subs, sub)
		if len(subs) == 0 {
			delete(g.subs, sub.key)
		}
	}
}

func (g *group) closeAll(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	for key, subs := range g.subs {
		for sub := range subs {
			sub.fail(err)
		}
		delete(g.subs, key)
	}
}

// Subscription is one reader's view of a request's stream.
type Subscription struct {
	hub    *Hub
	group  *group
	key    string
	notify chan struct{}

	mu      sync.Mutex
	cursor  string
	pending []Event
	err     error
}

// ErrTooSlow ends a subscription whose reader fell too far behind.
var ErrTooSlow = errors.New("event reader too slow; resume with Last-Event-ID")

func (sub *Subscription) cursorID() string {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.cursor
}

func (sub *Subscription) push(evs []Event, maxBuf int) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.err != nil {
		return
	}
	added := false
	for _, ev := range evs {
		if compareIDs(ev.ID, sub.cursor) <= 0 {
			continue
		}
		sub.pending = append(sub.pending, ev)
		sub.cursor = ev.ID
		added = true
	}
	if len(sub.pending) > maxBuf {
		sub.err = ErrTooSlow
		sub.pending = nil
		added = true
	}
	if added {
		select {
		case sub.notify <- struct{}{}:
		default:
		}
	}
}

func (sub *Subscription) fail(err error) {
	sub.mu.Lock()
	if sub.err == nil {
		sub.err = err
	}
	sub.mu.Unlock()
	select {
	case sub.notify <- struct{}{}:
	default:
	}
}

// Next waits for events and returns all that are buffered. It returns
// ctx.Err() when ctx ends, or the subscription's error (ErrClosed,
// ErrTooSlow) once buffered events are drained.
func (sub *Subscription) Next(ctx context.Context) ([]Event, error) {
	for {
		sub.mu.Lock()
		if len(sub.pending) > 0 {
			evs := sub.pending
			sub.pending = nil
			sub.mu.Unlock()
			return evs, nil
		}
		err := sub.err
		sub.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-sub.notify:
		}
	}
}

// Drain returns the buffered events without waiting; after the
// subscription ended it returns its error once nothing is buffered.
func (sub *Subscription) Drain() ([]Event, error) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if len(sub.pending) > 0 {
		evs := sub.pending
		sub.pending = nil
		if sub.err != nil {
			// The subscription ended after these arrived: its one signal
			// was spent on them, so signal again for the reader to come
			// back for the end.
			select {
			case sub.notify <- struct{}{}:
			default:
			}
		}
		return evs, nil
	}
	return nil, sub.err
}

// Notify returns a channel that receives when events may be ready; for
// callers that select over other work too. Follow it with Next.
func (sub *Subscription) Notify() <-chan struct{} { return sub.notify }

// Close stops delivery. It is safe to call more than once.
func (sub *Subscription) Close() {
	sub.group.remove(sub)
	sub.fail(ErrClosed)
}

// compareIDs orders stream IDs "<ms>-<seq>" numerically.
func compareIDs(a, b string) int {
	am, as := splitID(a)
	bm, bs := splitID(b)
	switch {
	case am < bm:
		return -1
	case am > bm:
		return 1
	case as < bs:
		return -1
	case as > bs:
		return 1
	}
	return 0
}

func splitID(id string) (uint64, uint64) {
	ms, seq, _ := strings.Cut(id, "-")
	m, _ := strconv.ParseUint(ms, 10, 64)
	s, _ := strconv.ParseUint(seq, 10, 64)
	return m, s
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
