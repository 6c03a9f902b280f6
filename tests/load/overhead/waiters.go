package overhead

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/load"
	"github.com/sluice-dev/sluice/tests/load/internal/machine"
	"github.com/sluice-dev/sluice/tests/load/internal/progress"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/load/internal/stats"
	"github.com/sluice-dev/sluice/workflows"
	"github.com/sluice-dev/sluice/workflows/signal"
)

// The waiters benchmark parks many chat workflows in one pool's queue on
// a single worker (the API process's embedded worker), measures what
// waiting costs that process, then lets them all through and checks that
// every one completed and nothing leaked. Workflows are started with the
// Temporal client directly, with the input the API would build, because
// the point is the waiting, not the HTTP door.

type waitersOptions struct {
	heldFlags
	// Filling the queue: how many workflows, how many started at once,
	// how long each may wait, how long the queue may take to fill.
	n, starters          int
	maxWait, queueWithin time.Duration
	// The waiters' re-check cadence.
	recheck time.Duration
	// Watching the full queue, then draining it.
	steady, drainWithin time.Duration
	drainLimit          int
}

func (w *waitersScenario) Flags(fs *flag.FlagSet) {
	fs.IntVar(&w.n, "n", 10000, "workflows to park in the queue")
	w.heldFlags.define(fs, "permits of the short pool, all held by fake holders while the queue fills")
	fs.IntVar(&w.starters, "starters", 16, "concurrent StartWorkflow calls")
	fs.DurationVar(&w.maxWait, "max-wait", 30*time.Minute, "each workflow's queue wait limit (ChatSettings.MaxWait)")
	fs.DurationVar(&w.recheck, "recheck", config.Default().Admission.RecheckInterval, "admission.recheck_interval: each waiter's fallback re-check, one workflow task per waiter per interval")
	fs.IntVar(&w.drainLimit, "drain-permits", 50, "the pool's permits while it drains (Gate.SetLimit)")
	fs.DurationVar(&w.queueWithin, "queue-within", 20*time.Minute, "stop and report how far the queue got if it is not full after this long")
	fs.DurationVar(&w.drainWithin, "drain-within", 40*time.Minute, "give up if the queue has not drained after this long")
	fs.DurationVar(&w.steady, "steady", 15*time.Second, "how long to watch the full queue before draining it")
}

// waitersScenario is the waiters benchmark: its flags, the workflows it
// parks, and what the process looked like before, while and after they
// waited.
type waitersScenario struct {
	waitersOptions
	cfg config.Config
	ids []string
	// Filling the queue.
	fillStart           time.Time
	started, startErrs  atomic.Int64
	errMu               sync.Mutex
	firstErr            error
	startedIn, queuedIn time.Duration
	// stalled is set when the queue did not fill within -queue-within.
	stalled *waitersStall
	// Waiting: the process's memory before, once all were queued, and
	// after watching them wait; the queue and the CPU while they waited.
	memBefore, memQueued, memWatched machine.Memory
	waiting                          int64
	queued                           admission.QueueStats
	waitCPU                          string
	// Draining.
	outcomesMu     sync.Mutex
	outcomes       map[string]int
	admissionWaits []time.Duration
	finished       atomic.Int64
	drainedIn      time.Duration
	peakDrain      machine.Memory
	after          []stack.PoolState
	running        int64
	// prog is the phase and what it has done (started, finished), for
	// the progress line.
	prog progress.Meter
}

// waitersStall is how far a queue that did not fill got, and what
// waiting cost by then.
type waitersStall struct {
	started int64
	waiting int
	mem     machine.Memory
	cpu     string
}

func (w *waitersScenario) Stacks() ([]stack.Options, error) {
	return []stack.Options{{
		Simulator: func(sim *llmsim.Config) {
			sim.TimeScale = 0.05
			sim.MaxNumSeqs = max(w.drainLimit, 16)
		},
		Configure: func(cfg *config.Config) {
			w.heldFlags.configure(cfg)
			cfg.Admission.RecheckInterval = w.recheck
			cfg.Admission.MaxQueueDepth = max(cfg.Admission.MaxQueueDepth, w.n+1000)
		},
	}}, nil
}

func (w *waitersScenario) Drive(ctx context.Context, st *stack.Stack) error {
	w.cfg = st.Config
	w.prog.Enter("hold-permits", -1)
	held, err := w.hold(ctx, st)
	if err != nil {
		return err
	}
	released := false
	defer func() {
		if !released {
			_, _ = held.ReleaseAll(ctx)
		}
	}()
	runtime.GC()
	w.memBefore = machine.ReadMemory()
	// Phase 1: fill the queue.
	w.prog.Enter(phaseFill, int64(w.n))
	if err := w.fill(ctx, st); err != nil || w.stalled != nil {
		return err
	}
	w.prog.Enter("watch", -1)
	w.watch(ctx, st)
	// Phase 2: let them through. Raise the limit first, then give back
	// the holders' permits the way a finishing request does; the worker's
	// janitor hands the rest of the new permits out within a second.
	drainStart := time.Now()
	if err := st.Core.Gate.SetLimit(ctx, heldPool, w.drainLimit); err != nil {
		return err
	}
	woken, err := held.ReleaseAll(ctx)
	released = true
	if err != nil {
		return err
	}
	if err := admission.Wake(ctx, st.Core.Gate, signal.Notifier{Client: st.Core.Temporal}, woken); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench waiters: wake:", err)
	}
	w.prog.Enter(phaseDrain, int64(w.n))
	if err := w.drain(ctx, st, drainStart); err != nil {
		return err
	}
	w.prog.Enter("check-leaks", -1)
	if w.after, _, err = stack.WaitIdle(ctx, st.Core.Gate, 0); err != nil {
		return err
	}
	w.running, err = stack.RunningChatWorkflows(ctx, st, 30*time.Second)
	return err
}

// The phases whose progress line has more to tell.
const (
	phaseFill  = "fill"
	phaseDrain = "drain"
)

// Status tells how far the phase got: the queue, the process's memory
// and, while draining, the workflows the server has seen complete
// (completions come in queue order, not start order, so the server's
// visibility counts them better than the awaited results do).
func (w *waitersScenario) Status(st *stack.Stack) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	qs, _ := st.Core.Gate.QueueStats(ctx, heldPool)
	m := machine.ReadMemory()
	s := fmt.Sprintf("%s queued=%d in_use=%d rss=%s goroutines=%d", w.prog.String(), qs.Waiting, qs.InUse, stats.MiB(float64(m.RSSKB)*1024), m.Goroutines)
	if w.prog.Current() == phaseDrain {
		completed, err := stack.CountChatWorkflows(ctx, st, "ExecutionStatus != 'Running'")
		if err != nil {
			completed = -1
		}
		s += fmt.Sprintf(" completed=%d", completed)
	}
	return s
}

// fill starts the workflows and waits until all of them are in the queue,
// or until -queue-within, when it measures how far the queue got.
func (w *waitersScenario) fill(ctx context.Context, st *stack.Stack) error {
	w.fillStart = time.Now()
	allStarted := w.startAll(ctx, st)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-allStarted:
			w.startedIn = time.Since(w.fillStart)
			if n := w.startErrs.Load(); n > 0 {
				fmt.Fprintf(os.Stderr, "sluice-bench waiters: %d starts failed, first: %v\n", n, w.firstErr)
			}
			allStarted = nil
		case <-time.After(200 * time.Millisecond):
		}
		qs, err := st.Core.Gate.QueueStats(ctx, heldPool)
		if err == nil && w.startedIn > 0 && qs.Waiting >= int(w.started.Load()) {
			w.queuedIn = time.Since(w.fillStart)
			w.memQueued = machine.ReadMemory()
			return nil
		}
		if time.Since(w.fillStart) > w.queueWithin {
			m := machine.ReadMemory()
			c0 := machine.TakeCPU()
			time.Sleep(w.steady)
			w.stalled = &waitersStall{started: w.started.Load(), waiting: qs.Waiting, mem: m, cpu: machine.CPUBetween(c0, machine.TakeCPU())}
			return nil
		}
	}
}

// startAll starts the workflows from -starters goroutines; the channel it
// returns is closed once every start returned.
func (w *waitersScenario) startAll(ctx context.Context, st *stack.Stack) <-chan struct{} {
	w.ids = make([]string, w.n)
	for i := range w.ids {
		w.ids[i] = "chat-" + ulid.Make().String()
	}
	jobs := load.Feed(ctx, len(w.ids))
	var wg sync.WaitGroup
	for range w.starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := startWaiter(ctx, st, w.cfg, w.ids[i], i, w.maxWait); err != nil {
					w.startErrs.Add(1)
					w.prog.Fail()
					w.errMu.Lock()
					if w.firstErr == nil {
						w.firstErr = err
					}
					w.errMu.Unlock()
					continue
				}
				w.started.Add(1)
				w.prog.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// watch measures the cost of waiting itself: CPU while nothing but
// waiting happens, then memory.
func (w *waitersScenario) watch(ctx context.Context, st *stack.Stack) {
	w.waiting = w.started.Load()
	fmt.Fprintf(os.Stderr, "%s all %d queued after %v; watching for %v\n", time.Now().Format("15:04:05"), w.waiting, w.queuedIn.Round(time.Second), w.steady)
	c0 := machine.TakeCPU()
	time.Sleep(w.steady)
	w.waitCPU = machine.CPUBetween(c0, machine.TakeCPU())
	runtime.GC()
	w.memWatched = machine.ReadMemory()
	w.queued, _ = st.Core.Gate.QueueStats(ctx, heldPool)
}

// drain awaits every workflow's result, and keeps the process's peak
// memory meanwhile.
func (w *waitersScenario) drain(ctx context.Context, st *stack.Stack, drainStart time.Time) error {
	w.outcomes = map[string]int{}
	results := load.Feed(ctx, len(w.ids))
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range results {
				w.collect(ctx, st, w.ids[i])
			}
		}()
	}
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	timeout := time.After(w.drainWithin)
	// The peak is sampled once a second: RSS moves with the drain's
	// batches, and a reading is cheap.
	memTick := time.NewTicker(time.Second)
	defer memTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout:
			return fmt.Errorf("not drained after %v: %d of %d finished", w.drainWithin, w.finished.Load(), w.n)
		case <-drained:
			w.drainedIn = time.Since(drainStart)
			return nil
		case <-memTick.C:
			if m := machine.ReadMemory(); m.RSSKB > w.peakDrain.RSSKB {
				w.peakDrain = m
			}
		}
	}
}

// collect awaits one workflow's result and counts its outcome.
func (w *waitersScenario) collect(ctx context.Context, st *stack.Stack, id string) {
	var r workflows.ChatResult
	err := st.Core.Temporal.GetWorkflow(ctx, workflows.ChatWorkflowID(id), "").Get(ctx, &r)
	k := r.Outcome
	if r.Reason != "" {
		k += " " + r.Reason
	}
	if err != nil {
		k = "workflow failed: " + err.Error()
	}
	w.outcomesMu.Lock()
	w.outcomes[k]++
	for _, t := range r.Timings {
		if t.Stage == request.StageAdmission {
			w.admissionWaits = append(w.admissionWaits, time.Duration(t.Ms)*time.Millisecond)
		}
	}
	w.outcomesMu.Unlock()
	w.finished.Add(1)
	w.prog.Add(1)
}

func (w *waitersScenario) Report(r *report.Report) error {
	r.Header(fmt.Sprintf("%d chat workflows started with the Temporal client (ChatInput as the API builds it, MaxWait %v, no search attributes) into the short pool's queue while its %d permits are held; one worker: the API process's embedded worker, in this process (temporal.max_concurrent_workflow_tasks %d, the SDK's default sticky cache of 10,000 workflows); admission.recheck_interval %v; then drained with %d permits",
		w.n, w.maxWait, w.holders, w.cfg.Temporal.MaxConcurrentWorkflowTasks, w.recheck, w.drainLimit))
	if s := w.stalled; s != nil {
		r.Linef("the queue did not fill within %v: %d of %d workflows started, %d waiting (%.1f queued/s on average)",
			w.queueWithin, s.started, w.n, s.waiting, float64(s.waiting)/w.queueWithin.Seconds())
		r.Linef("at that point: RSS %s (from %s), Go heap %s, %d goroutines; CPU over %v: %s",
			stats.MiB(float64(s.mem.RSSKB)*1024), stats.MiB(float64(w.memBefore.RSSKB)*1024), stats.MiB(float64(s.mem.HeapInuse)), s.mem.Goroutines, w.steady, s.cpu)
		r.Goal("waiting requests on one worker", fmt.Sprint(s.waiting), fmt.Sprintf(">= %d", w.n), false)
		return nil
	}
	w.memoryTable(r)
	r.Linef("")
	r.Linef("queue filled: %d started in %v (%.1f starts/s), all queued after %v; %d start errors",
		w.started.Load(), w.startedIn.Round(time.Second), float64(w.started.Load())/w.startedIn.Seconds(), w.queuedIn.Round(time.Second), w.startErrs.Load())
	r.Linef("while %d waited (%v): %d in the queue, oldest waiting %v; CPU %s", w.waiting, w.steady, w.queued.Waiting, w.queued.OldestWait.Round(time.Second), w.waitCPU)
	r.Linef("drain: all %d finished in %v (%.1f/s); peak RSS while draining %s", w.finished.Load(), w.drainedIn.Round(time.Second), float64(w.finished.Load())/w.drainedIn.Seconds(), stats.MiB(float64(w.peakDrain.RSSKB)*1024))
	aw := stats.Sorted(w.admissionWaits)
	r.Linef("admission wait per request (queued → permit, as the workflow saw it): p50 %v, p99 %v, max %v",
		aw.At(50).Round(time.Second), aw.At(99).Round(time.Second), aw.Max().Round(time.Second))
	keys := make([]string, 0, len(w.outcomes))
	for k := range w.outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	line := "outcomes:"
	for _, k := range keys {
		line += fmt.Sprintf(" %s×%d", k, w.outcomes[k])
	}
	r.Linef("%s", line)
	leaks := stack.LeftInPools(r.Linef, w.after)
	r.Goal("waiting requests on one worker", fmt.Sprint(w.queued.Waiting), fmt.Sprintf(">= %d", w.n), w.queued.Waiting >= w.n)
	r.Goal("completed with outcome done", fmt.Sprint(w.outcomes[request.OutcomeDone]), fmt.Sprint(w.n), w.outcomes[request.OutcomeDone] == w.n)
	r.Goal("permits in use + queue places left afterwards", fmt.Sprint(leaks), "0", leaks == 0)
	r.Goal("chat workflows still running afterwards", fmt.Sprint(w.running), "0", w.running == 0)
	return nil
}

// memoryTable adds the process's memory and goroutines before, while and
// after the queue was full.
func (w *waitersScenario) memoryTable(r *report.Report) {
	perWaiter := func(a, b float64) string { return fmt.Sprintf("%.1f KiB", (b-a)/float64(max(w.waiting, 1))/1024) }
	rss := func(m machine.Memory) float64 { return float64(m.RSSKB) * 1024 }
	heap := func(m machine.Memory) float64 { return float64(m.HeapInuse) }
	r.Table("", "before", "all queued", "after watching", "per waiter")
	before, queued, watched := w.memBefore, w.memQueued, w.memWatched
	r.Row("RSS (VmRSS: bench + API + worker)", stats.MiB(rss(before)), stats.MiB(rss(queued)), stats.MiB(rss(watched)), perWaiter(rss(before), rss(watched)))
	r.Row("Go heap in use", stats.MiB(heap(before)), stats.MiB(heap(queued)), stats.MiB(heap(watched)), perWaiter(heap(before), heap(watched)))
	r.Row("goroutines", fmt.Sprint(before.Goroutines), fmt.Sprint(queued.Goroutines), fmt.Sprint(watched.Goroutines),
		fmt.Sprintf("%.2f", float64(watched.Goroutines-before.Goroutines)/float64(max(w.waiting, 1))))
}

// startWaiter starts one chat workflow with the input api/chat.go builds.
func startWaiter(ctx context.Context, st *stack.Stack, cfg config.Config, id string, i int, maxWait time.Duration) error {
	// The standard tier's settings, but the bench's wait limit, no cap
	// on a tenant's waiting requests and no search attributes.
	settings := door.ChatSettings(cfg, cfg.Limits.Tiers["standard"])
	settings.MaxWait, settings.MaxPerTenant, settings.SearchAttributes = maxWait, 0, false
	in := workflows.ChatInput{
		RequestID: id, Tenant: fmt.Sprintf("bench-t%02d", i%50), User: fmt.Sprintf("bench-u%03d", i%500), Tier: "standard",
		Query: "How do leased permits work?", KB: cfg.Retrieval.DefaultKB, MaxTokens: 4,
		Settings: settings,
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := st.Core.Temporal.ExecuteWorkflow(sctx, client.StartWorkflowOptions{
		ID:                    workflows.ChatWorkflowID(id),
		TaskQueue:             cfg.Temporal.TaskQueue,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	}, workflows.ChatWorkflowName, in)
	return err
}
