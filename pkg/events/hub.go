package events

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hub multiplexes every SSE reader of one process onto a few blocking
// XREAD calls, one per shard, instead of holding one Redis connection per
// open stream. A new subscriber interrupts its shard's blocked XREAD by
// writing to the shard's private wake stream, so it is served at once.
type Hub struct {
	rdb    redis.UniversalClient
	log    *Log
	logger *slog.Logger
	block  time.Duration
	count  int64
	maxBuf int
	shards []*shard
}

// HubOptions configures a Hub.
type HubOptions struct {
	// Shards is the number of concurrent blocking XREADs (connections).
	Shards int
	// Block is how long one XREAD blocks; it bounds shutdown time.
	Block time.Duration
	// MaxBuffered events per subscriber before it is cut off as too slow
	// (the client can resume with Last-Event-ID).
	MaxBuffered int
	Logger      *slog.Logger
}

type shard struct {
	wakeKey string
	mu      sync.Mutex
	subs    map[string]map[*Subscription]struct{}
	stopped bool
}

// NewHub returns a Hub reading streams written through log. Call Run.
func NewHub(rdb redis.UniversalClient, log *Log, opts HubOptions) *Hub {
	if opts.Shards <= 0 {
		opts.Shards = 4
	}
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
	for i := 0; i < opts.Shards; i++ {
		h.shards = append(h.shards, &shard{
			wakeKey: fmt.Sprintf("%shub:%s:%d", log.prefix, instance, i),
			subs:    map[string]map[*Subscription]struct{}{},
		})
	}
	return h
}

// Run serves subscribers until ctx ends; then every open subscription
// gets ErrClosed.
func (h *Hub) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, s := range h.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.runShard(ctx, s)
		}()
	}
	wg.Wait()
	return nil
}

func (h *Hub) runShard(ctx context.Context, s *shard) {
	defer s.closeAll(ErrClosed)
	defer h.rdb.Del(context.Background(), s.wakeKey)
	// The wake cursor starts at a concrete entry, not "$": a wake written
	// between two XREADs must still be seen by the next one.
	wakeCursor, err := h.wake(ctx, s)
	for err != nil {
		h.logger.Warn("event hub cannot reach redis", "err", err)
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return
		}
		wakeCursor, err = h.wake(ctx, s)
	}
	for ctx.Err() == nil {
		streams, starts := s.snapshot(wakeCursor)
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
			if st.Stream == s.wakeKey {
				if n := len(st.Messages); n > 0 {
					wakeCursor = st.Messages[n-1].ID
				}
				continue
			}
			s.deliver(st.Stream, starts[st.Stream], decode(st.Messages), h.maxBuf)
		}
	}
}

func (h *Hub) wake(ctx context.Context, s *shard) (string, error) {
	pipe := h.rdb.Pipeline()
	add := pipe.XAdd(ctx, &redis.XAddArgs{Stream: s.wakeKey, MaxLen: 16, Approx: true, Values: []any{"w", 1}})
	pipe.PExpire(ctx, s.wakeKey, time.Hour)
	if _, err := pipe.Exec(ctx); err != nil {
		return "", fmt.Errorf("wake event hub shard: %w", err)
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
	s := h.shardFor(key)
	sub := &Subscription{hub: h, shard: s, key: key, cursor: afterID, notify: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if s.subs[key] == nil {
		s.subs[key] = map[*Subscription]struct{}{}
	}
	s.subs[key][sub] = struct{}{}
	s.mu.Unlock()
	// The wake only shortens the wait for the shard's next read (which
	// would otherwise come when its XREAD times out), so the caller need
	// not wait for it.
	go func() {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := h.wake(wctx, s); err != nil {
			h.logger.Warn("wake event hub shard", "err", err)
		}
	}()
	return sub, nil
}

func (h *Hub) shardFor(key string) *shard {
	f := fnv.New32a()
	_, _ = f.Write([]byte(key))
	return h.shards[int(f.Sum32()%uint32(len(h.shards)))]
}

// snapshot returns the XREAD arguments — each stream read from the lowest
// cursor of its readers — and that start cursor per stream.
func (s *shard) snapshot(wakeCursor string) ([]string, map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.subs)+1)
	ids := make([]string, 0, len(s.subs)+1)
	starts := make(map[string]string, len(s.subs))
	keys = append(keys, s.wakeKey)
	ids = append(ids, wakeCursor)
	for key, subs := range s.subs {
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
func (s *shard) deliver(key, start string, evs []Event, maxBuf int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs[key] {
		if start == "" || compareIDs(sub.cursorID(), start) < 0 {
			continue
		}
		sub.push(evs, maxBuf)
	}
}

func (s *shard) remove(sub *Subscription) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if subs := s.subs[sub.key]; subs != nil {
		delete(subs, sub)
		if len(subs) == 0 {
			delete(s.subs, sub.key)
		}
	}
}

func (s *shard) closeAll(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for key, subs := range s.subs {
		for sub := range subs {
			sub.fail(err)
		}
		delete(s.subs, key)
	}
}

// Subscription is one reader's view of a request's stream.
type Subscription struct {
	hub    *Hub
	shard  *shard
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
		return evs, nil
	}
	return nil, sub.err
}

// Notify returns a channel that receives when events may be ready; for
// callers that select over other work too. Follow it with Next.
func (sub *Subscription) Notify() <-chan struct{} { return sub.notify }

// Close stops delivery. It is safe to call more than once.
func (sub *Subscription) Close() {
	sub.shard.remove(sub)
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
