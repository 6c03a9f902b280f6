package main

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

	"github.com/sluice-dev/sluice/api"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/worker"
	"github.com/sluice-dev/sluice/workflows"
)

// The waiters benchmark parks many chat workflows in one pool's queue on
// a single worker (the API process's embedded worker), measures what
// waiting costs that process, then lets them all through and checks that
// every one completed and nothing leaked. Workflows are started with the
// Temporal client directly, with the input the API would build, because
// the point is the waiting, not the HTTP door.

type waitersOptions struct {
	n           int
	holders     int
	starters    int
	maxWait     time.Duration
	recheck     time.Duration
	maxRecheck  time.Duration
	drainLimit  int
	queueWithin time.Duration
	drainWithin time.Duration
	steady      time.Duration
	progress    time.Duration
}

func defineWaiters(fs *flag.FlagSet) func(context.Context) error {
	var o waitersOptions
	fs.IntVar(&o.n, "n", 10000, "workflows to park in the queue")
	fs.IntVar(&o.holders, "permits", 2, "permits of the short pool, all held by fake holders while the queue fills")
	fs.IntVar(&o.starters, "starters", 16, "concurrent StartWorkflow calls")
	fs.DurationVar(&o.maxWait, "max-wait", 30*time.Minute, "each workflow's queue wait limit (ChatSettings.MaxWait)")
	fs.DurationVar(&o.recheck, "recheck", config.Default().Admission.RecheckInterval, "admission.recheck_interval: each waiter's fallback re-check, one workflow task per waiter per interval")
	fs.DurationVar(&o.maxRecheck, "max-recheck", config.Default().Admission.MaxRecheckInterval, "admission.max_recheck_interval: the longest re-check cadence, for waiters far back")
	fs.IntVar(&o.drainLimit, "drain-permits", 50, "the pool's permits while it drains (Gate.SetLimit)")
	fs.DurationVar(&o.queueWithin, "queue-within", 20*time.Minute, "stop and report how far the queue got if it is not full after this long")
	fs.DurationVar(&o.drainWithin, "drain-within", 40*time.Minute, "give up if the queue has not drained after this long")
	fs.DurationVar(&o.steady, "steady", 15*time.Second, "how long to watch the full queue before draining it")
	fs.DurationVar(&o.progress, "progress", 10*time.Second, "progress line interval (stderr)")
	return func(ctx context.Context) error { return runWaiters(ctx, o) }
}

func runWaiters(ctx context.Context, o waitersOptions) error {
	sim := llmsim.DefaultConfig()
	sim.TimeScale = 0.05
	sim.MaxNumSeqs = max(o.drainLimit, 16)
	st, err := launchStack(ctx, stackOptions{Sim: &sim, Configure: func(cfg *config.Config) {
		cfg.Pools.Short.MaxConcurrency = o.holders
		cfg.Admission.RecheckInterval = o.recheck
		cfg.Admission.MaxRecheckInterval = o.maxRecheck
		cfg.Admission.MaxQueueDepth = max(cfg.Admission.MaxQueueDepth, o.n+1000)
	}})
	if err != nil {
		return err
	}
	defer st.Close()
	cfg, gate := st.cfg, st.rt.Gate
	const pool = "short"

	held, err := holdPermits(ctx, gate, pool, o.holders)
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
	base := readMemory()
	progress := func(phase string, done int64, since time.Time) {
		qs, _ := gate.QueueStats(ctx, pool)
		m := readMemory()
		rate := float64(done) / time.Since(since).Seconds()
		fmt.Fprintf(os.Stderr, "%s %s: %d (%.1f/s); queue %d waiting, %d in use; RSS %s, goroutines %d\n",
			time.Now().Format("15:04:05"), phase, done, rate, qs.Waiting, qs.InUse, mib(float64(m.rssKB)*1024), m.goroutines)
	}
	// Completions come in queue order, not start order, so progress is
	// counted by the server's visibility rather than by awaited results.
	completed := func() int64 {
		n, err := countChatWorkflows(ctx, st, "ExecutionStatus != 'Running'")
		if err != nil {
			return -1
		}
		return n
	}

	// Phase 1: fill the queue.
	ids := make([]string, o.n)
	for i := range ids {
		ids[i] = "chat-" + ulid.Make().String()
	}
	var started, startErrs atomic.Int64
	fillStart := time.Now()
	jobs := make(chan int)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for w := 0; w < o.starters; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := startWaiter(ctx, st, cfg, ids[i], i, o.maxWait); err != nil {
					startErrs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				started.Add(1)
			}
		}()
	}
	tick := time.NewTicker(o.progress)
	defer tick.Stop()
	go func() {
		defer close(jobs)
		for i := range ids {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	allStarted := make(chan struct{})
	go func() { wg.Wait(); close(allStarted) }()
	startedIn := time.Duration(0)
	var queuedIn time.Duration
	var full memory
	for queuedIn == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-allStarted:
			if startedIn == 0 {
				startedIn = time.Since(fillStart)
				if n := startErrs.Load(); n > 0 {
					fmt.Fprintf(os.Stderr, "sluice-bench waiters: %d starts failed, first: %v\n", n, firstErr.Load())
				}
			}
			allStarted = nil
		case <-tick.C:
			progress("started", started.Load(), fillStart)
		case <-time.After(200 * time.Millisecond):
		}
		qs, err := gate.QueueStats(ctx, pool)
		if err == nil && startedIn > 0 && qs.Waiting >= int(started.Load()) {
			queuedIn = time.Since(fillStart)
			full = readMemory()
			break
		}
		if time.Since(fillStart) > o.queueWithin {
			// Report what was reached: how far the queue got and what
			// waiting cost by then.
			m := readMemory()
			c0 := takeCPU()
			time.Sleep(o.steady)
			c1 := takeCPU()
			printWaitersHeader(o, cfg)
			fmt.Printf("the queue did not fill within %v: %d of %d workflows started, %d waiting (%.1f queued/s on average)\n",
				o.queueWithin, started.Load(), o.n, qs.Waiting, float64(qs.Waiting)/o.queueWithin.Seconds())
			fmt.Printf("at that point: RSS %s (from %s), Go heap %s, %d goroutines; CPU over %v: %s\n",
				mib(float64(m.rssKB)*1024), mib(float64(base.rssKB)*1024), mib(float64(m.heapInuse)), m.goroutines, o.steady, cpuBetween(c0, c1))
			goal("waiting requests on one worker", fmt.Sprint(qs.Waiting), fmt.Sprintf(">= %d", o.n), false)
			return nil
		}
	}
	waiting := started.Load()
	fmt.Fprintf(os.Stderr, "%s all %d queued after %v; watching for %v\n", time.Now().Format("15:04:05"), waiting, queuedIn.Round(time.Second), o.steady)

	// The cost of waiting itself: CPU while nothing but waiting happens.
	cpu0 := takeCPU()
	time.Sleep(o.steady)
	cpu1 := takeCPU()
	runtime.GC()
	steady := readMemory()
	qsFull, _ := gate.QueueStats(ctx, pool)

	// Phase 2: let them through. Raise the limit first, then give back
	// the holders' permits the way a finishing request does; the worker's
	// janitor hands the rest of the new permits out within a second.
	drainStart := time.Now()
	if err := gate.SetLimit(ctx, pool, o.drainLimit); err != nil {
		return err
	}
	notifier := worker.SignalNotifier{Client: st.rt.Temporal}
	woken, err := held.ReleaseAll(ctx)
	released = true
	if err != nil {
		return err
	}
	if err := admission.Wake(ctx, gate, notifier, pool, woken); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench waiters: wake:", err)
	}

	var outcomesMu sync.Mutex
	outcomes := map[string]int{}
	var admissionWaits []time.Duration
	var finished atomic.Int64
	results := make(chan int)
	var rwg sync.WaitGroup
	for w := 0; w < 64; w++ {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for i := range results {
				var r workflows.ChatResult
				err := st.rt.Temporal.GetWorkflow(ctx, workflows.ChatWorkflowID(ids[i]), "").Get(ctx, &r)
				k := r.Outcome
				if r.Reason != "" {
					k += " " + r.Reason
				}
				if err != nil {
					k = "workflow failed: " + err.Error()
				}
				outcomesMu.Lock()
				outcomes[k]++
				for _, t := range r.Timings {
					if t.Stage == workflows.StageAdmission {
						admissionWaits = append(admissionWaits, time.Duration(t.Ms)*time.Millisecond)
					}
				}
				outcomesMu.Unlock()
				finished.Add(1)
			}
		}()
	}
	go func() {
		defer close(results)
		for i := range ids {
			select {
			case results <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	drained := make(chan struct{})
	go func() { rwg.Wait(); close(drained) }()
	drainTimeout := time.After(o.drainWithin)
	var peakDrain memory
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-drainTimeout:
			return fmt.Errorf("not drained after %v: %d of %d finished", o.drainWithin, finished.Load(), o.n)
		case <-drained:
			done = true
		case <-tick.C:
			progress("completed", completed(), drainStart)
			if m := readMemory(); m.rssKB > peakDrain.rssKB {
				peakDrain = m
			}
		}
	}
	drainedIn := time.Since(drainStart)
	var after []admission.QueueStats
	for _, p := range gate.Pools() {
		qs, err := gate.QueueStats(ctx, p)
		if err != nil {
			return err
		}
		after = append(after, qs)
	}
	running, err := runningChatWorkflows(ctx, st, 30*time.Second)
	if err != nil {
		return err
	}

	printWaitersHeader(o, cfg)
	perWaiter := func(a, b float64) string { return fmt.Sprintf("%.1f KiB", (b-a)/float64(max(waiting, 1))/1024) }
	fmt.Println("| | before | all queued | after watching | per waiter |")
	fmt.Println("|---|---|---|---|---|")
	fmt.Printf("| RSS (VmRSS: bench + API + worker) | %s | %s | %s | %s |\n", mib(float64(base.rssKB)*1024), mib(float64(full.rssKB)*1024), mib(float64(steady.rssKB)*1024), perWaiter(float64(base.rssKB)*1024, float64(steady.rssKB)*1024))
	fmt.Printf("| Go heap in use | %s | %s | %s | %s |\n", mib(float64(base.heapInuse)), mib(float64(full.heapInuse)), mib(float64(steady.heapInuse)), perWaiter(float64(base.heapInuse), float64(steady.heapInuse)))
	fmt.Printf("| goroutines | %d | %d | %d | %.2f |\n", base.goroutines, full.goroutines, steady.goroutines, float64(steady.goroutines-base.goroutines)/float64(max(waiting, 1)))
	fmt.Println()
	fmt.Printf("queue filled: %d started in %v (%.1f starts/s), all queued after %v; %d start errors\n",
		started.Load(), startedIn.Round(time.Second), float64(started.Load())/startedIn.Seconds(), queuedIn.Round(time.Second), startErrs.Load())
	fmt.Printf("while %d waited (%v): %d in the queue, oldest waiting %v; CPU %s\n", waiting, o.steady, qsFull.Waiting, qsFull.OldestWait.Round(time.Second), cpuBetween(cpu0, cpu1))
	fmt.Printf("drain: all %d finished in %v (%.1f/s); peak RSS while draining %s\n", finished.Load(), drainedIn.Round(time.Second), float64(finished.Load())/drainedIn.Seconds(), mib(float64(peakDrain.rssKB)*1024))
	aw := sorted(admissionWaits)
	fmt.Printf("admission wait per request (queued → permit, as the workflow saw it): p50 %v, p99 %v, max %v\n",
		aw.at(50).Round(time.Second), aw.at(99).Round(time.Second), aw.max().Round(time.Second))
	keys := make([]string, 0, len(outcomes))
	for k := range outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Print("outcomes:")
	for _, k := range keys {
		fmt.Printf(" %s×%d", k, outcomes[k])
	}
	fmt.Println()
	leaks := 0
	for i, p := range gate.Pools() {
		fmt.Printf("pool %s afterwards: %d in use, %d waiting\n", p, after[i].InUse, after[i].Waiting)
		leaks += after[i].InUse + after[i].Waiting
	}
	goal("waiting requests on one worker", fmt.Sprint(qsFull.Waiting), fmt.Sprintf(">= %d", o.n), qsFull.Waiting >= o.n)
	goal("completed with outcome done", fmt.Sprint(outcomes[workflows.OutcomeDone]), fmt.Sprint(o.n), outcomes[workflows.OutcomeDone] == o.n)
	goal("permits in use + queue places left afterwards", fmt.Sprint(leaks), "0", leaks == 0)
	goal("chat workflows still running afterwards", fmt.Sprint(running), "0", running == 0)
	return nil
}

func printWaitersHeader(o waitersOptions, cfg config.Config) {
	header("waiters", fmt.Sprintf("%d chat workflows started with the Temporal client (ChatInput as the API builds it, MaxWait %v, no search attributes) into the short pool's queue while its %d permits are held; one worker: the API process's embedded worker, in this process (temporal.max_concurrent_workflow_tasks %d, the SDK's default sticky cache of 10,000 workflows); admission.recheck_interval %v growing to %v far back in the queue; then drained with %d permits",
		o.n, o.maxWait, o.holders, cfg.Temporal.MaxConcurrentWorkflowTasks, o.recheck, o.maxRecheck, o.drainLimit))
}

// startWaiter starts one chat workflow with the input api/chat.go builds.
func startWaiter(ctx context.Context, st *stack, cfg config.Config, id string, i int, maxWait time.Duration) error {
	// The standard tier's settings, but the bench's wait limit, no cap
	// on a tenant's waiting requests and no search attributes.
	settings := api.ChatSettings(cfg, cfg.Limits.Tiers["standard"])
	settings.MaxWait, settings.MaxPerTenant, settings.SearchAttributes = maxWait, 0, false
	in := workflows.ChatInput{
		RequestID: id, Tenant: fmt.Sprintf("bench-t%02d", i%50), User: fmt.Sprintf("bench-u%03d", i%500), Tier: "standard",
		Query: "How do leased permits work?", KB: cfg.Retrieval.DefaultKB, MaxTokens: 4,
		Settings: settings,
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := st.rt.Temporal.ExecuteWorkflow(sctx, client.StartWorkflowOptions{
		ID:                    workflows.ChatWorkflowID(id),
		TaskQueue:             cfg.Temporal.TaskQueue,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	}, workflows.ChatWorkflowName, in)
	return err
}
