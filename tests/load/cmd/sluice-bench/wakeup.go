package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/worker"
	"github.com/sluice-dev/sluice/workflows"
)

// The wakeup benchmark measures how long a queued request waits after a
// permit is given back: the short pool's permits are all held by fake
// holders; a real request is sent through the API and waits in the queue;
// then one holder lets go exactly as a finishing request does
// (Gate.Release, which hands the permit to the next waiter, then
// admission.Wake, which signals its workflow), and the clock runs until
// the request's retrieval stage event arrives on its SSE stream.

type wakeupOptions struct {
	n, warmup int
	holders   int
	settle    time.Duration
	maxTokens int
}

func defineWakeup(fs *flag.FlagSet) func(context.Context) error {
	var o wakeupOptions
	fs.IntVar(&o.n, "n", 100, "measured wake-ups, one at a time")
	fs.IntVar(&o.warmup, "warmup", 5, "unmeasured wake-ups first")
	fs.IntVar(&o.holders, "permits", 2, "permits of the short pool, all held by fake holders")
	fs.DurationVar(&o.settle, "settle", 200*time.Millisecond, "pause between the request's queue event and the release: shorter than admission.fast_wait (1s), the waiter is still waiting fast; longer, its workflow is parked and woken by the signal")
	fs.IntVar(&o.maxTokens, "max-tokens", 4, "tokens per answer")
	return func(ctx context.Context) error { return runWakeup(ctx, o) }
}

const wakePool = "short"

func runWakeup(ctx context.Context, o wakeupOptions) error {
	sim := llmsim.DefaultConfig()
	sim.TimeScale = 0.1 // the answer only has to end; keep each round short
	st, err := launchStack(ctx, stackOptions{Sim: &sim, Configure: func(cfg *config.Config) {
		cfg.Pools.Short.MaxConcurrency = o.holders
	}})
	if err != nil {
		return err
	}
	defer st.Close()
	gate := st.rt.Gate
	notifier := worker.SignalNotifier{Client: st.rt.Temporal}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}

	held, err := holdPermits(ctx, gate, wakePool, o.holders)
	if err != nil {
		return err
	}
	defer func() { _, _ = held.ReleaseAll(ctx) }()

	var total, release, signal, written []time.Duration
	body := fmt.Sprintf(`{"query":"How do leased permits work?","max_tokens":%d}`, o.maxTokens)
	for i := 0; i < o.warmup+o.n; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s, err := postChat(ctx, hc, st.baseURL, body, nil)
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if _, err := s.until(func(ev testenv.SSEEvent) bool {
			return ev.Event == events.TypeQueue || isStage(ev, workflows.StageRetrieval) || events.Terminal(ev.Event)
		}); err != nil {
			s.close()
			return err
		}
		time.Sleep(o.settle)

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
			ev, err := s.until(func(ev testenv.SSEEvent) bool {
				return isStage(ev, workflows.StageRetrieval) || events.Terminal(ev.Event)
			})
			arrived <- arrival{ev, time.Now(), err}
		}()
		t0 := time.Now()
		rel, err := gate.Release(ctx, wakePool, holder)
		t1 := time.Now()
		if err != nil {
			s.close()
			return err
		}
		if len(rel.Woken) != 1 || rel.Woken[0] != s.id {
			s.close()
			return fmt.Errorf("round %d: releasing %s woke %v, want [%s]", i, holder, rel.Woken, s.id)
		}
		if err := admission.Wake(ctx, gate, notifier, wakePool, rel.Woken); err != nil {
			s.close()
			return err
		}
		t2 := time.Now()
		got := <-arrived
		ev, t3, err := got.ev, got.at, got.err
		if err != nil {
			s.close()
			return err
		}
		if !isStage(ev, workflows.StageRetrieval) {
			s.close()
			return fmt.Errorf("round %d: %s ended with %s %s before retrieval", i, s.id, ev.Event, ev.Data)
		}
		last, err := s.until(func(ev testenv.SSEEvent) bool { return events.Terminal(ev.Event) })
		s.close()
		if err != nil {
			return err
		}
		if last.Event != events.TypeDone {
			return fmt.Errorf("round %d: %s ended with %s %s", i, s.id, last.Event, last.Data)
		}
		// Its permit is given back by finalize, after the done event; only
		// then can a new holder take it without queueing.
		if err := st.rt.Temporal.GetWorkflow(ctx, workflows.ChatWorkflowID(s.id), "").Get(ctx, nil); err != nil {
			return err
		}
		if err := held.Add(ctx); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if i < o.warmup {
			continue
		}
		total = append(total, t3.Sub(t0))
		release = append(release, t1.Sub(t0))
		signal = append(signal, t2.Sub(t1))
		if at, ok := streamTime(ev.ID); ok {
			written = append(written, at.Sub(t0))
		}
	}
	stats, err := gate.Stats(ctx, wakePool)
	if err != nil {
		return err
	}

	header("wakeup", fmt.Sprintf("%d sequential wake-ups after %d warm-up: the short pool's %d permits held by fake holders, a chat request queued through the API (%v after its queue event), then one holder released as a finishing request does (Gate.Release + admission.Wake with worker.SignalNotifier)",
		o.n, o.warmup, o.holders, o.settle))
	fmt.Println("| from the release call to | p50 | p90 | p99 | max |")
	fmt.Println("|---|---|---|---|---|")
	row := func(what string, ds []time.Duration, f func(time.Duration) string) {
		l := sorted(ds)
		fmt.Printf("| %s | %s | %s | %s | %s |\n", what, f(l.at(50)), f(l.at(90)), f(l.at(99)), f(l.max()))
	}
	row("Release returned (the Redis hand-off: release.lua)", release, msFine)
	row("Wake returned (the announcement, or the admitted signal accepted by Temporal)", relative(release, signal), msFine)
	row("retrieval stage event written (Redis stream id, ±1 ms)", written, ms)
	row("**retrieval stage event read from the SSE stream**", total, msFine)
	fmt.Println()
	fmt.Printf("signal call alone: p50 %s, p99 %s; pool after the run: %d in use (the holders), %d waiting\n",
		msFine(sorted(signal).at(50)), msFine(sorted(signal).at(99)), stats.InUse, stats.Waiting)
	l := sorted(total)
	goal("wake-up p50, release → next waiter's retrieval stage on SSE", msFine(l.at(50)), "<= 5 ms", l.at(50) <= 5*time.Millisecond)
	goal("wake-up p99", msFine(l.at(99)), "<= 25 ms", l.at(99) <= 25*time.Millisecond)
	rl := sorted(release)
	fmt.Printf("Redis hand-off (Release script round trip): p50 %s, p99 %s\n", msFine(rl.at(50)), msFine(rl.at(99)))
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

// relative adds each base duration to the matching step: times measured
// from the same start.
func relative(base, step []time.Duration) []time.Duration {
	out := make([]time.Duration, len(step))
	for i := range step {
		out[i] = base[i] + step[i]
	}
	return out
}
