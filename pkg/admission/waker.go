package admission

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A waiter learns of its permit through a Temporal signal, which is
// durable but costs a server round trip (~5 ms on the dev server) before
// its workflow even runs. A waiter whose turn is near can instead wait a
// moment inside its admission activity for the news over Redis pub/sub.
//
// Who tells whom is settled by one key per fast waiter: the waiter sets it
// once it is queued near the head; a releaser that hands it a permit deletes
// it, and if that delete removed the key, the releaser announces the grant
// on the channel instead of signalling. A waiter that gives up deletes the
// key itself: if it was already gone, a releaser took it over, which it
// only does after the hand-off, so the permit is the waiter's even if the
// announcement (at-most-once) never arrives. Exactly one of them acts, and
// no grant is lost.

// grantChannel carries the ids Wake announces, one message per call.
func (g *Gate) grantChannel() string { return g.prefix + "adm:granted" }

func (g *Gate) fastKey(requestID string) string { return g.prefix + "adm:fast:" + requestID }

// claimFast takes over telling requestID of its grant: true when it was
// waiting fast (and now expects the announcement, not a signal).
func (g *Gate) claimFast(ctx context.Context, requestID string) (bool, error) {
	n, err := g.cmd.Del(ctx, g.fastKey(requestID)).Result()
	if err != nil {
		return false, fmt.Errorf("claim fast waiter %s: %w", requestID, err)
	}
	return n == 1, nil
}

// announce publishes that ids were granted a permit.
func (g *Gate) announce(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	if err := g.cmd.Publish(ctx, g.grantChannel(), strings.Join(ids, "\n")).Err(); err != nil {
		return fmt.Errorf("announce %d grants: %w", len(ids), err)
	}
	return nil
}

// Waker delivers announced grants to the requests waiting for one in this
// process: one subscription per process, however many wait.
type Waker struct {
	gate *Gate
	ps   *redis.PubSub
	done chan struct{}

	mu      sync.Mutex
	waiting map[string]chan struct{}
	// watching holds the topics watched for every announcement (Watch).
	watching map[string]chan struct{}
}

// NewWaker subscribes to g's grant announcements. Close it when done.
func NewWaker(ctx context.Context, rdb redis.UniversalClient, g *Gate) (*Waker, error) {
	ps := rdb.Subscribe(ctx, g.grantChannel())
	// The first reply confirms the subscription: announcements made after
	// NewWaker returns reach it.
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, fmt.Errorf("subscribe to grant announcements: %w", err)
	}
	w := &Waker{gate: g, ps: ps, done: make(chan struct{}), waiting: map[string]chan struct{}{},
		watching: map[string]chan struct{}{}}
	// The reader is the subscription's, not a loop of the process: it is
	// what keeps the promise above from the moment NewWaker returns, and
	// it ends when Close ends the subscription.
	go w.run()
	return w, nil
}

func (w *Waker) run() {
	defer close(w.done)
	for msg := range w.ps.Channel() {
		for _, id := range strings.Split(msg.Payload, "\n") {
			w.mu.Lock()
			ch, ok := w.waiting[id]
			if ok {
				delete(w.waiting, id)
				close(ch)
			}
			if ch, ok := w.watching[id]; ok {
				select {
				case ch <- struct{}{}:
				default: // one pending is as good as several
				}
			}
			w.mu.Unlock()
		}
	}
}

// FastWait is one request waiting for its grant announcement.
type FastWait struct {
	w  *Waker
	id string
	// C is closed when the grant is announced.
	C  <-chan struct{}
	ch chan struct{}
}

// Expect marks requestID as waiting fast for up to ttl, and End must
// follow on every path. A grant made before the mark was signalled.
func (w *Waker) Expect(ctx context.Context, requestID string, ttl time.Duration) (*FastWait, error) {
	ch := make(chan struct{})
	w.mu.Lock()
	w.waiting[requestID] = ch
	w.mu.Unlock()
	f := &FastWait{w: w, id: requestID, C: ch, ch: ch}
	if err := w.gate.cmd.Set(ctx, w.gate.fastKey(requestID), "1", ttl).Err(); err != nil {
		f.forget()
		return nil, fmt.Errorf("mark %s as waiting fast: %w", requestID, err)
	}
	return f, nil
}

// End stops waiting. granted is true when a releaser had already taken
// over telling this request of its grant: the permit is the request's,
// announced or not.
func (f *FastWait) End(ctx context.Context) (granted bool, err error) {
	f.forget()
	select {
	case <-f.ch:
		return true, nil
	default:
	}
	withdrawn, err := f.w.gate.claimFast(ctx, f.id)
	if err != nil {
		return false, err
	}
	return !withdrawn, nil
}

func (f *FastWait) forget() {
	f.w.mu.Lock()
	if f.w.waiting[f.id] == f.ch {
		delete(f.w.waiting, f.id)
	}
	f.w.mu.Unlock()
}

// Listen registers topic (an id that no request has: pauseTopic) with
// the subscription: the returned channel is closed when topic is
// announced. stop forgets it.
func (w *Waker) Listen(topic string) (c <-chan struct{}, stop func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	w.waiting[topic] = ch
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		if w.waiting[topic] == ch {
			delete(w.waiting, topic)
		}
		w.mu.Unlock()
	}
}

// Watch registers topic with the subscription for good: the returned
// channel receives after each announcement of topic, several announcements
// before a receive counting as one. stop forgets it. One watcher per
// topic and process.
func (w *Waker) Watch(topic string) (c <-chan struct{}, stop func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.watching[topic] = ch
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		if w.watching[topic] == ch {
			delete(w.watching, topic)
		}
		w.mu.Unlock()
	}
}

// Close ends the subscription.
func (w *Waker) Close() error {
	err := w.ps.Close()
	<-w.done
	return err
}
