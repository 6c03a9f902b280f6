// Package follow is a client's side of a request the door started:
// reading its events as they come (Follow, with its queue position while
// it waits), coming back for them (Resume, Attach), leaving (Detach) and
// asking it to stop (Cancel). What it writes for a client goes through a
// Sink, so it knows nothing of the transport; the liveness sweep
// (follow/liveness) ends the streams of requests whose workflow is gone.
package follow

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/follow/liveness"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Follower follows started requests for their clients. One per API
// process.
type Follower struct {
	temporal client.Client
	events   *events.Log
	hub      *events.Hub
	gate     *admission.Gate
	live     *liveness.Sweeper
	opts     Options
	// draining is set when the process shuts down: streams that end do
	// not detach their requests (their clients resume elsewhere).
	draining atomic.Bool
	// keepAlive is keepAliveInterval, a field so that tests need not wait
	// for it.
	keepAlive time.Duration
	logger    *slog.Logger
}

// Options are a Follower's dependencies and settings.
type Options struct {
	Temporal client.Client
	Events   *events.Log
	Hub      *events.Hub
	Gate     *admission.Gate
	// Liveness is the process's sweep, which Follow tells what it follows.
	Liveness *liveness.Sweeper
	// QueuePollInterval is how often a waiting request's position is
	// read (api.queue_poll_interval).
	QueuePollInterval time.Duration
	// IdleTimeout is how long a stream may be quiet before its workflow
	// is looked for (api.stream_idle_timeout).
	IdleTimeout time.Duration
	// StopTTL is how long a stop flag raised for a request waiting at a
	// door lives (events.ttl).
	StopTTL time.Duration
	Logger  *slog.Logger
}

// New builds a Follower.
func New(opts Options) (*Follower, error) {
	if opts.Temporal == nil || opts.Events == nil || opts.Hub == nil || opts.Gate == nil || opts.Liveness == nil {
		return nil, errors.New("follow: Temporal, Events, Hub, Gate and Liveness are required")
	}
	if opts.QueuePollInterval <= 0 || opts.IdleTimeout <= 0 || opts.StopTTL <= 0 {
		return nil, errors.New("follow: QueuePollInterval, IdleTimeout and StopTTL must be positive")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Follower{temporal: opts.Temporal, events: opts.Events, hub: opts.Hub, gate: opts.Gate, live: opts.Liveness,
		opts: opts, keepAlive: keepAliveInterval, logger: opts.Logger}, nil
}

// Drain marks the process as shutting down: streams that end from now on
// do not detach their requests (the clients resume against another
// instance).
func (f *Follower) Drain() { f.draining.Store(true) }

// Draining reports whether Drain was called.
func (f *Follower) Draining() bool { return f.draining.Load() }

// streamState follows a request through its events, so that the stream
// knows when to poll the queue position and when it is over.
type streamState struct {
	queued bool
	pool   string
	// position is the place the client was last told, at toldAt (zero:
	// by an event this reader read, not wrote).
	position int
	toldAt   time.Time
	terminal bool
	// started: the request's workflow wrote an event, so it exists.
	started bool
	// lookedBack: the log was read once for a start this reader's cursor
	// may have passed.
	lookedBack bool
	// tokens is how many tokens were sent: the next one's index.
	tokens int
}

// repeated reports a token already sent: a write the activity retried
// while Redis stalled may have landed twice.
func (st *streamState) repeated(ev events.Event) bool {
	if ev.Type != events.TypeToken {
		return false
	}
	var tok struct {
		Index int `json:"index"`
	}
	if json.Unmarshal(ev.Data, &tok) != nil {
		return false
	}
	if tok.Index < st.tokens {
		return true
	}
	st.tokens = tok.Index + 1
	return false
}

func (st *streamState) observe(ev events.Event) {
	switch ev.Type {
	case events.TypeQueue:
		var q events.Queue
		if json.Unmarshal(ev.Data, &q) == nil {
			st.queued, st.pool, st.position = true, q.Pool, q.Position
		}
	case events.TypeToken:
		st.started = true
	case events.TypeStage:
		st.started = true
		var sg events.Stage
		if json.Unmarshal(ev.Data, &sg) == nil && sg.Stage != request.StageAdmission && sg.Stage != request.StageEmbed {
			st.queued = false
		}
	default:
		if events.Terminal(ev.Type) {
			st.queued = false
			st.terminal = true
		}
	}
}

// Sink renders a request's events for one client.
type Sink interface {
	// write renders one event; an error means the client is gone.
	Write(ev events.Event) error
	// keepAlive is called when the stream has been quiet for a while.
	KeepAlive() error
	// flush sends what was written; an error means the client is gone.
	Flush() error
}

// End is why follow returned.
type End int

const (
	// EndTerminal: the request's terminal event was written.
	EndTerminal End = iota
	// EndClientGone: the client left, or writing to it failed.
	EndClientGone
	// EndInterrupted: the hub stopped (shutdown) or this reader fell
	// behind; the request goes on without this reader.
	EndInterrupted
)

// keepAliveInterval is how long a stream may be quiet before a keep-alive
// tells proxies and the client that it lives.
const keepAliveInterval = 15 * time.Second

// Follow feeds the request's events to out until its terminal event or
// until the reader can go no further. With positions set it also reports
// the request's queue position while it waits. The caller decides what a
// reader that did not reach the end means for the request.
func (f *Follower) Follow(ctx context.Context, sub *events.Subscription, id string, out Sink, positions bool) End {
	st := &streamState{}
	defer f.live.Follow(id)()
	poll := time.NewTicker(f.opts.QueuePollInterval)
	defer poll.Stop()
	keepAlive := time.NewTicker(f.keepAlive)
	defer keepAlive.Stop()
	idle := time.NewTimer(f.opts.IdleTimeout)
	defer idle.Stop()

	for {
		select {
		case <-ctx.Done():
			return EndClientGone
		case <-sub.Notify():
			evs, err := sub.Drain()
			if err != nil {
				return EndInterrupted
			}
			if len(evs) == 0 {
				continue
			}
			for _, ev := range evs {
				if st.repeated(ev) {
					continue
				}
				if err := out.Write(ev); err != nil {
					return EndClientGone
				}
				st.observe(ev)
			}
			if st.started {
				f.live.Started(id)
			}
			if err := out.Flush(); err != nil {
				return EndClientGone
			}
			if st.terminal {
				return EndTerminal
			}
			idle.Reset(f.opts.IdleTimeout)
		case <-poll.C:
			if positions && st.queued && f.pastDoor(ctx, id, st) {
				f.reportPosition(ctx, id, st)
			}
		case <-keepAlive.C:
			if err := out.KeepAlive(); err != nil {
				return EndClientGone
			}
			if err := out.Flush(); err != nil {
				return EndClientGone
			}
		case <-idle.C:
			f.endIfGone(ctx, id, st.started)
			idle.Reset(f.opts.IdleTimeout)
		}
	}
}

// pastDoor reports whether the request's workflow started. Until then it
// waits at a door, which reports its place there itself: polling the
// pool's queue for it would cost a round trip per waiter and poll for
// nothing. A reader learns of the start from the stage event it reads, or,
// when it resumed past that event, from one look at the log.
func (f *Follower) pastDoor(ctx context.Context, id string, st *streamState) bool {
	if !st.started && !st.lookedBack {
		st.lookedBack = true
		st.started = f.hasStage(ctx, id)
	}
	return st.started
}

// reportPosition writes a queue event when the request's place changed.
// Positions are read here, outside the workflow, because workflow timers
// are too coarse for sub-second updates.
func (f *Follower) reportPosition(ctx context.Context, id string, st *streamState) {
	pos, ok, err := f.gate.Position(ctx, st.pool, id)
	now := time.Now()
	if err != nil || !ok || !admission.WorthTelling(admission.Told{Position: st.position, At: st.toldAt}, pos, now) {
		return
	}
	stats, err := f.gate.Stats(ctx, st.pool)
	if err != nil {
		return
	}
	q := events.Queue{Position: pos, EstimatedWaitMs: admission.EstimateWait(pos, stats.Limit, stats.MeanHold).Milliseconds(), Pool: st.pool}
	if _, err := f.events.Append(ctx, id, events.TypeQueue, q); err != nil {
		f.logger.Warn("write queue event", "requestID", id, "err", err)
		return
	}
	// Remember it now so that a slow hub does not make us write it twice.
	st.position, st.toldAt = pos, now
}

// endIfGone checks a stream that has been quiet for
// api.stream_idle_timeout: a request whose workflow is gone gets its error
// event, which ends every reader. The liveness rounds check only requests
// seen started; this also covers a reader that joined past the events
// that showed it (a resume), by looking for them in the log.
func (f *Follower) endIfGone(ctx context.Context, id string, started bool) {
	if !started && !f.hasStage(ctx, id) {
		// Still at a door, which ends it itself.
		return
	}
	f.live.Started(id)
	if gone, status := f.live.Describe(ctx, id); gone {
		f.live.End(ctx, id, status)
	}
}

// hasStage reports whether the request's log shows a stage, which only
// its workflow writes.
func (f *Follower) hasStage(ctx context.Context, id string) bool {
	evs, err := f.events.After(ctx, id, "0", 64)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(evs, func(ev events.Event) bool { return ev.Type == events.TypeStage })
}
