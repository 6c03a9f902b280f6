package admission

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A waiter learns of its permit through a Temporal signal, which is
// durable but costs a server round trip (~5 ms on the dev server) before
// its workflow even runs. A waiter whose turn is near can instead wait a
// moment inside its admission activity for the same news over Redis
// pub/sub, and go on at once. Pub/sub is at-most-once, so Wake still sends
// the signal; it only stops mattering.

// grantChannel carries the ids Wake announces, one message per call.
func (g *Gate) grantChannel() string { return g.prefix + "adm:granted" }

// Announce publishes that ids were granted a permit (best effort: the
// signal Wake sends next is what a waiter can rely on).
func (g *Gate) Announce(ctx context.Context, ids []string) error {
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
	ps   *redis.PubSub
	done chan struct{}

	mu      sync.Mutex
	waiting map[string]chan struct{}
}

// NewWaker subscribes to g's grant announcements. Close it when done.
func NewWaker(ctx context.Context, rdb redis.UniversalClient, g *Gate) (*Waker, error) {
	ps := rdb.Subscribe(ctx, g.grantChannel())
	// The first reply confirms the subscription: announcements made after
	// NewWaker returns are not missed.
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, fmt.Errorf("subscribe to grant announcements: %w", err)
	}
	w := &Waker{ps: ps, done: make(chan struct{}), waiting: map[string]chan struct{}{}}
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
			w.mu.Unlock()
		}
	}
}

// Expect returns a channel closed when requestID's grant is announced, and
// a func to stop waiting. Call it before asking for the permit, so that a
// grant announced in between is not missed.
func (w *Waker) Expect(requestID string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	w.waiting[requestID] = ch
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		if w.waiting[requestID] == ch {
			delete(w.waiting, requestID)
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
