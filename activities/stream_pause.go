package activities

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Preemption by continuation, a stream's side: a stream that can be
// paused says so every keep-alive round (admission.Gate.Pausable); asked
// to pause, it cancels its upstream call, keeps the text streamed so
// far, hands its permit to the urgent waiter and queues again at the
// head of the line (Yield), waits for its grant inside this activity,
// heartbeating (no Temporal event per pause), and continues the answer
// (llm.Request.Resume) on any endpoint of its pool. The client's token
// indices run on: tokens are counted across the pauses, never repeated.
// The continued request's usage covers only what it added (llm), so each
// token is billed once, as after a failover.

var errPaused = errors.New("stream paused for a more urgent request")

// errPauseLost ends a paused stream whose permit or place was taken from
// it (its lease ran out, or the healer shed its place): the client keeps
// the tokens it has, and the answer ends interrupted.
var errPauseLost = errors.New("a paused stream lost its place in the queue")

// pauseRecheck is how often a paused stream checks its grant when no
// announcement came (announcements are at most once) and renews its
// queue place and its fast-wait mark.
const pauseRecheck = time.Second

// pauser is one stream's pausing state, shared with its keep-alive.
type pauser struct {
	rank int
	// pauses is how often it was paused; from is the token count at its
	// last (re)start.
	pauses, from atomic.Int64
	// waiting is set while it waits for its grant: the keep-alive then
	// neither renews a permit it does not hold nor offers it for a pause.
	waiting atomic.Bool
	// never is set once the answer cannot be continued (tool calls).
	never atomic.Bool
	// ready asks the keep-alive for a round now: the stream just reached
	// MinTokens since its (re)start, and may be paused from now on.
	ready chan struct{}
	// announced is set once the stream told the Askers, since its last
	// (re)start, that it may be paused.
	announced atomic.Bool

	mu     sync.Mutex
	cancel context.CancelCauseFunc
}

// pauserFor is the request's pauser, or nil when it may not be paused:
// preemption is off, its pool's backend cannot continue an answer, it
// asks several choices, it is of the most urgent class (nothing outranks
// it), or this worker has no grant announcements to wait on.
func (a *Chat) pauserFor(in LLMInput, pool Pool) *pauser {
	if !a.Options.Preemption.Enabled || !pool.Continues || in.Choices > 1 || a.Waker == nil {
		return nil
	}
	rank, _ := request.ClassRank(request.ServedClass(in.ServiceTier))
	if rank == 0 {
		return nil
	}
	return &pauser{rank: rank, ready: make(chan struct{}, 1)}
}

// streamed notes that the stream has streamed tokens in all, asking the
// keep-alive for a round at once when it just became pausable: the
// waiters that found no stream to pause learn of it then, not a second
// later.
func (p *pauser) streamed(tokens int64, rules admission.PauseRules) {
	if tokens-p.from.Load() != int64(rules.MinTokens) {
		return
	}
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

// restarted notes that the stream (re)started at tokens.
func (p *pauser) restarted(tokens int64) {
	p.from.Store(tokens)
	p.announced.Store(false)
}

// pause stops the current upstream call, if the stream may still pause.
func (p *pauser) pause() {
	if p.never.Load() || p.waiting.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel != nil {
		p.cancel(errPaused)
	}
}

// offer tells the gate that the stream may be paused, and pauses it when
// the gate asked: one round trip of its keep-alive round.
func (a *Chat) offer(ctx context.Context, log *slog.Logger, in LLMInput, p *pauser, tokens int64) {
	if p == nil || p.never.Load() || p.waiting.Load() {
		return
	}
	if activity.IsActivity(ctx) {
		info := activity.GetInfo(ctx)
		if tooLateToPause(info.StartedTime, info.Deadline, time.Now()) {
			// Withdrawn, with any ask: the waiter that asked finds
			// another stream.
			p.never.Store(true)
			if err := a.Gate.Unpausable(ctx, in.Pool, in.RequestID); err != nil && ctx.Err() == nil {
				log.Warn("withdraw the stream from pausing", "err", err)
			}
			return
		}
	}
	waiter, err := a.Gate.Pausable(ctx, in.Pool, in.RequestID, p.rank, int(p.pauses.Load()), int(tokens-p.from.Load()))
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("offer the stream for pausing", "err", err)
		}
		return
	}
	if waiter != "" {
		log.Info("pausing the stream for a more urgent request", "for", waiter, "tokens", tokens)
		p.pause()
		return
	}
	rules := a.Options.Preemption.PauseRules
	if tokens-p.from.Load() >= int64(rules.MinTokens) && p.pauses.Load() < int64(rules.MaxPauses) && !p.announced.Swap(true) {
		if err := a.Gate.AnnouncePausable(ctx); err != nil && ctx.Err() == nil {
			log.Warn("announce that the stream may be paused", "err", err)
		}
	}
}

// tooLateToPause reports whether a stream whose LLM activity started at
// started and must end by deadline (llm.timeout) has too little of that
// time left to be paused: a pause's wait for its permit counts against
// it, and a stream whose time ran out while paused would end cut off. It
// is paused only in the first half of its time, so a pause takes it past
// its deadline only if the wait is longer than everything before it.
func tooLateToPause(started, deadline, now time.Time) bool {
	if started.IsZero() || deadline.IsZero() {
		return false
	}
	return deadline.Sub(now) < deadline.Sub(started)/2
}

// listenForPause pauses the stream as soon as the gate announces that it
// was asked to (admission.PauseTopic), ahead of its keep-alive round,
// which reads the same ask in case the announcement (at most once) is
// lost. It ends with ctx.
func (a *Chat) listenForPause(ctx context.Context, in LLMInput, p *pauser) {
	for {
		asked, stop := a.Waker.Listen(admission.PauseTopic(in.RequestID))
		select {
		case <-ctx.Done():
			stop()
			return
		case <-asked:
			p.pause()
		}
	}
}

// streamPausing streams the answer, pausing it whenever its keep-alive
// is asked to, and continuing it after each pause until it ends.
func (a *Chat) streamPausing(ctx context.Context, log *slog.Logger, in LLMInput, pool Pool, req llm.Request, s *tokenStream, p *pauser) (llm.Result, error) {
	if p == nil {
		return pool.Streamer.Stream(ctx, req, s.onToken)
	}
	s.keep = true
	defer func() {
		if err := a.Gate.Unpausable(context.WithoutCancel(ctx), in.Pool, in.RequestID); err != nil {
			log.Warn("forget the stream as pausable", "err", err)
		}
	}()
	onToken := func(d llm.Delta) error {
		// Only text can be continued (stream_resume.go resumable).
		if len(d.ToolCalls) > 0 || d.Choice != 0 {
			p.never.Store(true)
		}
		err := s.onToken(d)
		p.streamed(int64(s.tokens()), a.Options.Preemption.PauseRules)
		return err
	}
	var failovers []llm.Failover
	for {
		uctx, cancel := context.WithCancelCause(ctx)
		p.mu.Lock()
		p.cancel = cancel
		p.mu.Unlock()
		res, err := pool.Streamer.Stream(uctx, req, onToken)
		p.mu.Lock()
		p.cancel = nil
		p.mu.Unlock()
		cancel(nil)
		res.Failovers = append(failovers, res.Failovers...)
		if err == nil || ctx.Err() != nil || !errors.Is(context.Cause(uctx), errPaused) {
			return res, err
		}
		failovers = res.Failovers
		if err := a.pauseAndWait(ctx, log, in, p); err != nil {
			return res, err
		}
		req.Resume = &llm.Resume{Text: strings.Join(s.answer, ""), Pieces: s.tokens()}
		p.restarted(int64(s.tokens()))
	}
}

// pauseAndWait gives the permit to the waiter the stream was paused for
// and waits, inside the activity, until the request is granted one again.
// The fast-wait mark is set before the permit goes, and kept until the
// grant, so that every grant is announced to this activity rather than
// signalled to the workflow.
func (a *Chat) pauseAndWait(ctx context.Context, log *slog.Logger, in LLMInput, p *pauser) error {
	p.waiting.Store(true)
	defer p.waiting.Store(false)
	mark := 3 * pauseRecheck
	fast, err := a.Waker.Expect(ctx, in.RequestID, mark)
	if err != nil {
		return err
	}
	defer func() { _, _ = fast.End(context.WithoutCancel(ctx)) }()
	y, err := a.Gate.Yield(ctx, in.Pool, admission.YieldRequest{ID: in.RequestID, Weight: max(in.Weight, 1),
		MaxConcurrent: in.MaxConcurrent, AliveFor: admission.AliveFor(pauseRecheck), Class: request.ServedClass(in.ServiceTier)})
	if err != nil {
		return err
	}
	if len(y.Woken) > 0 {
		if err := admission.Wake(ctx, a.Gate, a.Notifier, y.Woken); err != nil {
			log.Warn("wake the request the stream paused for", "err", err)
		}
	}
	switch {
	case y.Held:
		return nil
	case !y.Paused:
		return errPauseLost
	}
	p.pauses.Add(1)
	a.Metrics.StreamPaused(in.Pool)
	t := time.NewTicker(pauseRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-fast.C:
			return nil
		case <-t.C:
		}
		if held, err := a.Gate.Renew(ctx, in.Pool, in.RequestID); err == nil && held {
			return nil
		}
		if _, queued, err := a.Gate.Position(ctx, in.Pool, in.RequestID); err == nil && !queued {
			// Granted between the two reads, or gone.
			if held, err := a.Gate.Renew(ctx, in.Pool, in.RequestID); err == nil && held {
				return nil
			}
			return errPauseLost
		}
		if err := a.Gate.KeepAlive(ctx, in.Pool, in.RequestID, admission.AliveFor(pauseRecheck)); err != nil {
			log.Warn("keep the paused stream's place", "err", err)
		}
		if fast, err = a.Waker.Expect(ctx, in.RequestID, mark); err != nil {
			return err
		}
	}
}

// count is how often the stream was paused; 0 for one that may not be.
func (p *pauser) count() int {
	if p == nil {
		return 0
	}
	return int(p.pauses.Load())
}
