package activities

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/activity"
)

// keepAlive runs beside the stream: it heartbeats (so a slow first token
// is not mistaken for a lost worker, and so Temporal can deliver a
// cancellation), checks the stop flag between tokens too, charges the
// request's tenant for the output streamed since its last round (pay as
// you go: one round trip a round, none when no token came), and renews the
// permit's lease at a third of its length. Its first round runs at once,
// in parallel with the request to the backend rather than before it: the
// permit may have waited through retrieval, rerank and the task queue, and
// the request may have been cancelled meanwhile.
// A stream that may be paused (p not nil) offers itself each round
// (stream_pause.go), and one more as soon as it may be paused, and renews
// no lease while it waits paused.
func (a *Chat) keepAlive(ctx context.Context, stop context.CancelCauseFunc, log *slog.Logger, in LLMInput, stopKey string, n *atomic.Int64, p *pauser) {
	renewEvery := a.Gate.Lease() / 3
	tick := min(time.Second, renewEvery)
	t := time.NewTicker(tick)
	defer t.Stop()
	// StreamLLM renewed the lease just before starting this loop.
	lastRenew := time.Now()
	warned := false
	// A resumed attempt's first charge counts the earlier attempt's tokens
	// too: the gate charges only what was not charged yet.
	charged := int64(0)
	var ready <-chan struct{}
	if p != nil {
		ready = p.ready
	}
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-ready:
			}
			activity.RecordHeartbeat(ctx, streamProgress{Tokens: int(n.Load())})
			charged = a.chargeOutput(ctx, log, in, n.Load(), charged)
			a.offer(ctx, log, in, p, n.Load())
		}
		if stopped, err := a.Redis.Exists(ctx, stopKey).Result(); err == nil && stopped == 1 {
			stop(errStopped)
			return
		}
		if time.Since(lastRenew) < renewEvery || p != nil && p.waiting.Load() {
			continue
		}
		lastRenew = time.Now()
		held, err := a.Gate.Renew(ctx, in.Pool, in.RequestID)
		if err != nil && ctx.Err() == nil {
			log.Warn("renew permit lease", "err", err)
		}
		if err == nil && !held && !warned {
			// The lease ran out (e.g. Redis was unreachable for a whole
			// lease). Cutting the answer off would hurt the user more than
			// a briefly exceeded limit, so the stream goes on; the limit
			// heals when it ends.
			log.Warn("permit lease lost while streaming", "pool", in.Pool)
			warned = true
		}
	}
}

// chargeOutput charges the request's tenant for its tokens up to tokens,
// when more came than the charged already paid for, and returns the
// tokens charged for now. A failed charge is retried on the next round;
// whatever is never charged, the release settles.
func (a *Chat) chargeOutput(ctx context.Context, log *slog.Logger, in LLMInput, tokens, charged int64) int64 {
	if tokens <= charged {
		return charged
	}
	ticks, err := a.Gate.Charge(ctx, in.Pool, in.RequestID, a.Options.usedCost(0, int(tokens)))
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("charge streamed tokens", "err", err)
		}
		return charged
	}
	if ticks > 0 {
		a.Metrics.StreamedCharged(in.Pool, tokens-charged)
	}
	return tokens
}
