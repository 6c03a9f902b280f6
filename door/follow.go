package door

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// streamState follows a request through its events, so that the stream
// knows when to poll the queue position and when it is over.
type streamState struct {
	queued   bool
	pool     string
	position int
	terminal bool
	// started: the request's workflow wrote an event, so it exists.
	started bool
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
func (d *Door) Follow(ctx context.Context, sub *events.Subscription, id string, out Sink, positions bool) End {
	st := &streamState{}
	defer d.live.follow(id)()
	poll := time.NewTicker(d.cfg.API.QueuePollInterval)
	defer poll.Stop()
	keepAlive := time.NewTicker(keepAliveInterval)
	defer keepAlive.Stop()
	idle := time.NewTimer(d.cfg.API.StreamIdleTimeout)
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
				d.live.started(id)
			}
			if err := out.Flush(); err != nil {
				return EndClientGone
			}
			if st.terminal {
				return EndTerminal
			}
			idle.Reset(d.cfg.API.StreamIdleTimeout)
		case <-poll.C:
			if positions && st.queued {
				d.reportPosition(ctx, id, st)
			}
		case <-keepAlive.C:
			if err := out.KeepAlive(); err != nil {
				return EndClientGone
			}
			if err := out.Flush(); err != nil {
				return EndClientGone
			}
		case <-idle.C:
			d.endIfGone(ctx, id, st.started)
			idle.Reset(d.cfg.API.StreamIdleTimeout)
		}
	}
}

// reportPosition writes a queue event when the request's place changed.
// Positions are read here, outside the workflow, because workflow timers
// are too coarse for sub-second updates.
func (d *Door) reportPosition(ctx context.Context, id string, st *streamState) {
	pos, ok, err := d.gate.Position(ctx, st.pool, id)
	if err != nil || !ok || pos == st.position {
		return
	}
	stats, err := d.gate.Stats(ctx, st.pool)
	if err != nil {
		return
	}
	q := events.Queue{Position: pos, EstimatedWaitMs: admission.EstimateWait(pos, stats.Limit, stats.MeanHold).Milliseconds(), Pool: st.pool}
	if _, err := d.events.Append(ctx, id, events.TypeQueue, q); err != nil {
		d.logger.Warn("write queue event", "requestID", id, "err", err)
		return
	}
	// Remember it now so that a slow hub does not make us write it twice.
	st.position = pos
}

// endIfGone checks a stream that has been quiet for
// api.stream_idle_timeout: a request whose workflow is gone gets its error
// event, which ends every reader. The liveness rounds check only requests
// seen started; this also covers a reader that joined past the events
// that showed it (a resume), by looking for them in the log.
func (d *Door) endIfGone(ctx context.Context, id string, started bool) {
	if !started && !d.hasStage(ctx, id) {
		// Still at a door, which ends it itself.
		return
	}
	d.live.started(id)
	if gone, status := d.live.describe(ctx, id); gone {
		d.live.end(ctx, id, status)
	}
}

// hasStage reports whether the request's log shows a stage, which only
// its workflow writes.
func (d *Door) hasStage(ctx context.Context, id string) bool {
	evs, err := d.events.After(ctx, id, "0", 64)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(evs, func(ev events.Event) bool { return ev.Type == events.TypeStage })
}

// Detach tells the workflow that a reader left. It must outlive the
// request's context, which is already cancelled.
func (d *Door) Detach(id string) {
	if d.Draining() {
		// The process is going away, not the client: it will resume
		// against another instance.
		return
	}
	d.DetachNow(id)
}

// DetachNow tells the workflow that a reader left, even while the
// process drains: for a client that cannot resume (an OpenAI client), the
// request should end rather than run for nobody.
func (d *Door) DetachNow(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := d.temporal.SignalWorkflow(ctx, workflows.ChatWorkflowID(id), "", workflows.SignalDetach, workflows.AttachSignal{})
	if err != nil && !isNotFound(err) {
		d.logger.Warn("signal detach", "requestID", id, "err", err)
	}
}
