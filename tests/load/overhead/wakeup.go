package overhead

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/progress"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
	"github.com/sluice-dev/sluice/workflows/signal"
)

// The wakeup benchmark measures how long a queued request waits after a
// permit is given back: the short pool's permits are all held by fake
// holders; a real request is sent through the API and waits in the queue;
// then one holder lets go exactly as a finishing request does
// (Gate.Release, which hands the permit to the next waiter, then
// admission.Wake, which signals its workflow), and the clock runs until
// the request's retrieval stage event arrives on its SSE stream.

type wakeupOptions struct {
	heldFlags
	// Rounds, one at a time; the pause before each release; each answer's
	// length.
	n, warmup int
	settle    time.Duration
	maxTokens int
}

func (w *wakeupScenario) Flags(fs *flag.FlagSet) {
	fs.IntVar(&w.n, "n", 100, "measured wake-ups, one at a time")
	fs.IntVar(&w.warmup, "warmup", 5, "unmeasured wake-ups first")
	w.heldFlags.define(fs, "permits of the short pool, all held by fake holders")
	fs.DurationVar(&w.settle, "settle", 200*time.Millisecond, "pause between the request's queue event and the release: shorter than admission.fast_wait (1s), the waiter is still waiting fast; longer, its workflow is parked and woken by the signal")
	fs.IntVar(&w.maxTokens, "max-tokens", 4, "tokens per answer")
}

// wakeupScenario is the wakeup benchmark: its flags, the clients it
// drives with, and each measured round's times from the release call.
type wakeupScenario struct {
	wakeupOptions
	hc       *http.Client
	notifier signal.Notifier
	rounds   []wakeTimes
	// after is the pool once the rounds are over.
	after admission.Stats
	// For the progress line: rounds done, the latest wake-up.
	prog     progress.Meter
	lastWake atomic.Int64
}

// wakeTimes are one round's times from the release call: to Release
// returning, to Wake returning, to the retrieval stage event being
// written (if its stream id told) and being read from the SSE stream.
type wakeTimes struct {
	release, wake, total time.Duration
	written              time.Duration
	hasWritten           bool
}

func (w *wakeupScenario) Stacks() ([]stack.Options, error) {
	return []stack.Options{{
		// The answer only has to end; keep each round short.
		Simulator: func(sim *llmsim.Config) { sim.TimeScale = 0.1 },
		Configure: w.heldFlags.configure,
	}}, nil
}

func (w *wakeupScenario) Drive(ctx context.Context, st *stack.Stack) error {
	w.hc = st.Client(4)
	w.notifier = signal.Notifier{Client: st.Core.Temporal}
	w.prog.Enter("hold-permits", -1)
	held, err := w.hold(ctx, st)
	if err != nil {
		return err
	}
	defer func() { _, _ = held.ReleaseAll(ctx) }()
	for i := 0; i < w.warmup+w.n; i++ {
		if i == w.warmup {
			w.prog.Enter("measuring", int64(w.n))
		} else if i == 0 {
			w.prog.Enter("warm-up", int64(w.warmup))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t, err := w.round(ctx, st, held)
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		w.prog.Add(1)
		w.lastWake.Store(int64(t.total))
		if i >= w.warmup {
			w.rounds = append(w.rounds, t)
		}
	}
	w.after, err = st.Core.Gate.Stats(ctx, heldPool)
	return err
}

func (w *wakeupScenario) Status(*stack.Stack) string {
	return fmt.Sprintf("%s wake_last=%.2fms", w.prog.String(), stats.Millis(time.Duration(w.lastWake.Load())))
}

// round queues one request behind the holders, releases one holder for
// it, and takes a new holder once the request is over.
func (w *wakeupScenario) round(ctx context.Context, st *stack.Stack, held *holders) (wakeTimes, error) {
	body := fmt.Sprintf(`{"query":"How do leased permits work?","max_tokens":%d}`, w.maxTokens)
	s, err := chat.Post(ctx, w.hc, st.BaseURL, body, nil)
	if err != nil {
		return wakeTimes{}, err
	}
	t, err := w.wake(ctx, st.Core.Gate, held, s)
	s.Close()
	if err != nil {
		return t, err
	}
	// Its permit is given back by finalize, after the done event; only
	// then can a new holder take it without queueing.
	if err := st.Core.Temporal.GetWorkflow(ctx, workflows.ChatWorkflowID(s.ID), "").Get(ctx, nil); err != nil {
		return t, err
	}
	return t, held.Add(ctx)
}

// wake waits for s to be queued, lets one holder go exactly as a finishing
// request does, and times s's way to its retrieval stage; then reads s to
// its end.
func (w *wakeupScenario) wake(ctx context.Context, gate *admission.Gate, held *holders, s *chat.Stream) (wakeTimes, error) {
	if _, err := s.Until(func(ev testenv.SSEEvent) bool {
		return ev.Event == events.TypeQueue || isStage(ev, request.StageRetrieval) || events.Terminal(ev.Event)
	}); err != nil {
		return wakeTimes{}, err
	}
	time.Sleep(w.settle)
	holder := held.Pop()
	// The stream is read while the releaser is still notifying: the
	// waiter may be on its way before the notifier returns.
	type arrival struct {
		ev  testenv.SSEEvent
		at  time.Time
		err error
	}
	arrived := make(chan arrival, 1)
	go func() {
		ev, err := s.Until(func(ev testenv.SSEEvent) bool {
			return isStage(ev, request.StageRetrieval) || events.Terminal(ev.Event)
		})
		arrived <- arrival{ev, time.Now(), err}
	}()
	t0 := time.Now()
	rel, err := gate.Release(ctx, heldPool, holder)
	t1 := time.Now()
	if err != nil {
		return wakeTimes{}, err
	}
	if len(rel.Woken) != 1 || rel.Woken[0].ID != s.ID {
		return wakeTimes{}, fmt.Errorf("releasing %s woke %v, want [%s]", holder, rel.Woken, s.ID)
	}
	if err := admission.Wake(ctx, gate, w.notifier, rel.Woken); err != nil {
		return wakeTimes{}, err
	}
	t2 := time.Now()
	got := <-arrived
	if got.err != nil {
		return wakeTimes{}, got.err
	}
	if !isStage(got.ev, request.StageRetrieval) {
		return wakeTimes{}, fmt.Errorf("%s ended with %s %s before retrieval", s.ID, got.ev.Event, got.ev.Data)
	}
	t := wakeTimes{release: t1.Sub(t0), wake: t2.Sub(t0), total: got.at.Sub(t0)}
	if at, ok := streamTime(got.ev.ID); ok {
		t.written, t.hasWritten = at.Sub(t0), true
	}
	return t, awaitDone(s)
}

// awaitDone reads s to its terminal event, which must be done.
func awaitDone(s *chat.Stream) error {
	last, err := s.Until(func(ev testenv.SSEEvent) bool { return events.Terminal(ev.Event) })
	if err != nil {
		return err
	}
	if last.Event != events.TypeDone {
		return fmt.Errorf("%s ended with %s %s", s.ID, last.Event, last.Data)
	}
	return nil
}

func (w *wakeupScenario) Report(r *report.Report) error {
	var total, release, wake, signal, written []time.Duration
	for _, t := range w.rounds {
		total, release, wake = append(total, t.total), append(release, t.release), append(wake, t.wake)
		signal = append(signal, t.wake-t.release)
		if t.hasWritten {
			written = append(written, t.written)
		}
	}
	r.Header(fmt.Sprintf("%d sequential wake-ups after %d warm-up: the short pool's %d permits held by fake holders, a chat request queued through the API (%v after its queue event), then one holder released as a finishing request does (Gate.Release + admission.Wake with signal.Notifier)",
		w.n, w.warmup, w.holders, w.settle))
	r.Table("from the release call to", "p50", "p90", "p99", "max")
	row := func(what string, ds []time.Duration, f func(time.Duration) string) {
		l := stats.Sorted(ds)
		r.Row(what, f(l.At(50)), f(l.At(90)), f(l.At(99)), f(l.Max()))
	}
	row("Release returned (the Redis hand-off: release.lua)", release, stats.MsFine)
	row("Wake returned (the announcement, or the admitted signal accepted by Temporal)", wake, stats.MsFine)
	row("retrieval stage event written (Redis stream id, ±1 ms)", written, stats.Ms)
	row("**retrieval stage event read from the SSE stream**", total, stats.MsFine)
	r.Linef("")
	r.Linef("signal call alone: p50 %s, p99 %s; pool after the run: %d in use (the holders), %d waiting",
		stats.MsFine(stats.Sorted(signal).At(50)), stats.MsFine(stats.Sorted(signal).At(99)), w.after.InUse, w.after.Waiting)
	l := stats.Sorted(total)
	r.Goal("wake-up p50, release → next waiter's retrieval stage on SSE", stats.MsFine(l.At(50)), "<= 5 ms", l.At(50) <= 5*time.Millisecond)
	r.Goal("wake-up p99", stats.MsFine(l.At(99)), "<= 25 ms", l.At(99) <= 25*time.Millisecond)
	rl := stats.Sorted(release)
	r.Linef("Redis hand-off (Release script round trip): p50 %s, p99 %s", stats.MsFine(rl.At(50)), stats.MsFine(rl.At(99)))
	return nil
}

func isStage(ev testenv.SSEEvent, stage string) bool {
	if ev.Event != events.TypeStage {
		return false
	}
	var s events.Stage
	return ev.Decode(&s) == nil && s.Stage == stage
}

// streamTime is when Redis wrote a stream entry, from its id ("<ms>-<seq>").
func streamTime(id string) (time.Time, bool) {
	msPart, _, ok := strings.Cut(id, "-")
	if !ok {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(msPart, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}
