package admission

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Asker keeps asking, for the urgent waiters this process queued, that a
// less urgent stream be paused for them (Preempt). A waiter's first ask,
// as it queues, finds none when every less urgent stream is still within
// its first MinTokens tokens, its tenant is held back by its cap, or the
// stream it named ended before it paused. Its workflow then waits for a
// signal, with no re-check an urgent class's TTFT SLO of about a second
// could wait for, and a timer per waiter per interval would cost Temporal
// events. So the process that queued it asks again whenever a stream
// announces that it may now be paused (AnnouncePausable), and every
// AskEvery in case an announcement (at most once) was lost, until the
// waiter is no longer queued or its wait ends. A process that dies
// forgets its waiters; a waiter's workflow asks again when it re-checks.
type Asker struct {
	gate  *Gate
	waker *Waker
	rules PauseRules
	log   *slog.Logger
	every time.Duration // AskEvery; tests change it

	mu      sync.Mutex
	wants   map[string]want
	running bool
	closed  bool
	stop    chan struct{}
}

// want is one waiter an Asker asks for.
type want struct {
	pool  string
	rank  int
	since time.Time // its first ask: older waiters are asked for first
	until time.Time
}

// AskEvery is how often an Asker asks again without an announcement.
const AskEvery = 250 * time.Millisecond

// askPerRound bounds the asks of one round: the oldest waiters of the
// most urgent class go first, and more asks than a pool has streams to
// pause would only find none. Waiters beyond it wait for a later round.
const askPerRound = 32

// NewAsker asks for waiters on g, learning of streams that may be
// paused through w.
func NewAsker(g *Gate, w *Waker, rules PauseRules, logger *slog.Logger) *Asker {
	return &Asker{gate: g, waker: w, rules: rules, log: logger, every: AskEvery, wants: map[string]want{}, stop: make(chan struct{})}
}

// Want asks now for a stream of waiterID's pool (or group) to be paused
// for it, queued in pool with class rank, and keeps asking until it is
// no longer queued or waitFor (0: the gate's WaiterTTL) passes; asked
// again for the same waiter, it keeps its age and extends its wait. It
// returns the stream asked now, if any.
func (a *Asker) Want(ctx context.Context, pool, waiterID string, rank int, waitFor time.Duration) (string, error) {
	victim, err := a.gate.Preempt(ctx, pool, waiterID, rank, a.rules)
	if errors.Is(err, ErrNotQueued) {
		return "", nil
	}
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return victim, err
	}
	w := want{pool: pool, rank: rank, since: now, until: now.Add(cmp.Or(waitFor, a.gate.aliveTTL))}
	if was, ok := a.wants[waiterID]; ok {
		w.since = was.since
	}
	a.wants[waiterID] = w
	if !a.running {
		a.running = true
		go a.run()
	}
	return victim, err
}

// Waiting is how many waiters a is asking for.
func (a *Asker) Waiting() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.wants)
}

// Close stops asking.
func (a *Asker) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.closed = true
		close(a.stop)
	}
}

// run asks a round after each announcement and each AskEvery, while
// there are waiters to ask for: the loop lives only as long as they do.
func (a *Asker) run() {
	kick, forget := a.waker.Watch(PausableTopic)
	defer forget()
	tick := time.NewTicker(a.every)
	defer tick.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-kick:
		case <-tick.C:
		}
		if !a.round() {
			return
		}
	}
}

// round asks once for the waiters in order, forgetting those no longer
// queued or past their wait, and reports whether any are left (when
// none are, the loop ends, and the next Want starts another).
func (a *Asker) round() (more bool) {
	a.mu.Lock()
	ids := make([]string, 0, len(a.wants))
	for id := range a.wants {
		ids = append(ids, id)
	}
	wants := make(map[string]want, len(ids))
	for _, id := range ids {
		wants[id] = a.wants[id]
	}
	a.mu.Unlock()
	slices.SortFunc(ids, func(x, y string) int {
		wx, wy := wants[x], wants[y]
		return cmp.Or(cmp.Compare(wx.rank, wy.rank), wx.since.Compare(wy.since), cmp.Compare(x, y))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	now := time.Now()
	asked := 0
	for _, id := range ids {
		w := wants[id]
		if now.After(w.until) {
			a.forget(id, w)
			continue
		}
		if asked == askPerRound {
			continue
		}
		asked++
		_, err := a.gate.Preempt(ctx, w.pool, id, w.rank, a.rules)
		if errors.Is(err, ErrNotQueued) {
			a.forget(id, w)
		} else if err != nil {
			// Redis is failing: every other ask of the round would too.
			a.log.Warn("ask again for a stream to pause", "waiter", id, "err", err)
			break
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.wants) == 0 || a.closed {
		a.running = false
		return false
	}
	return true
}

// forget drops id unless a later Want changed it meanwhile.
func (a *Asker) forget(id string, w want) {
	a.mu.Lock()
	if a.wants[id] == w {
		delete(a.wants, id)
	}
	a.mu.Unlock()
}
