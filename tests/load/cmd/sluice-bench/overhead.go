package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/worker"
)

// The overhead benchmark runs, interleaved and one at a time, the same
// streamed completion four ways:
//
//	direct  client → simulator (OpenAI streaming API)
//	bare    a bare Temporal workflow of Sluice's shape: 4 no-op local
//	        activities, 1 regular activity streaming tokens into a Redis
//	        stream, 1 local activity writing "done"; the client reads the
//	        stream with XREAD
//	bare, done from the stream
//	        the same, but the streaming activity writes "done" itself, as
//	        Sluice's does
//	sluice  HTTP POST /v1/chat → the full ChatWorkflow → SSE
//
// All send the identical prompt (retrieved context included), so the
// simulator's prefill and decode time is the same and the differences are
// orchestration. It prints p50/p99 of time to first token and total time.

type overheadOptions struct {
	n, warmup, maxTokens int
	searchAttrs          bool
	gap                  time.Duration
}

func defineOverhead(fs *flag.FlagSet) func(context.Context) error {
	var o overheadOptions
	fs.IntVar(&o.n, "n", 200, "measured requests per path")
	fs.IntVar(&o.warmup, "warmup", 20, "unmeasured requests per path first")
	fs.IntVar(&o.maxTokens, "max-tokens", 16, "tokens per answer")
	fs.BoolVar(&o.searchAttrs, "search-attributes", true, "let Sluice upsert its search attributes")
	fs.DurationVar(&o.gap, "gap", 50*time.Millisecond, "pause before each request, so the server is idle when it starts")
	return func(ctx context.Context) error { return runOverhead(ctx, o) }
}

var trace = os.Getenv("BENCH_TRACE") == "1"

func runOverhead(ctx context.Context, o overheadOptions) error {
	n, warmup, maxTokens, gap := o.n, o.warmup, o.maxTokens, o.gap
	st, err := launchStack(ctx, stackOptions{Quiet: true, Configure: func(cfg *config.Config) {
		cfg.Temporal.SearchAttributes = o.searchAttrs
	}})
	if err != nil {
		return err
	}
	defer st.Close()
	rt, cfg, baseURL := st.rt, st.cfg, st.baseURL

	// The stack's second runtime gives the bench its own Temporal client,
	// the same retrieval stack (to build identical prompts) and the pool's
	// client.
	b := &bare{rdb: rt.Redis, llm: rt.Activities.Pools["short"].Streamer}
	const bareQueue = "sluice-bench-bare"
	w := sdkworker.New(rt.Temporal, bareQueue, sdkworker.Options{})
	w.RegisterWorkflow(BareWorkflow)
	w.RegisterActivity(b)
	w.RegisterActivityWithOptions(noop, activity.RegisterOptions{Name: "noop"})
	if err := w.Start(); err != nil {
		return err
	}
	defer w.Stop()

	queries := []string{
		"How does a token bucket refill?", "What is weighted fair queuing?", "How do leased permits work?",
		"What is continuous batching?", "Why does the P99/P50 ratio matter?", "How are Redis streams used for SSE?",
		"What does Temporal replay check?", "How is a KV cache paged?", "What is a retry storm?", "How do caches stay fresh?",
	}
	prompts := map[string][]llm.Message{}
	for _, q := range queries {
		msgs, err := samePrompt(ctx, rt, cfg, q)
		if err != nil {
			return err
		}
		prompts[q] = msgs
	}

	paths := []struct {
		name string
		run  func(ctx context.Context, i int, q string) (ttft, total time.Duration, err error)
	}{
		{"direct", func(ctx context.Context, _ int, q string) (time.Duration, time.Duration, error) {
			return direct(ctx, b.llm, prompts[q], maxTokens)
		}},
		{"bare", func(ctx context.Context, i int, q string) (time.Duration, time.Duration, error) {
			return bareRun(ctx, rt.Temporal, rt.Redis, bareQueue, fmt.Sprintf("bare-%d-%d", time.Now().UnixNano(), i), prompts[q], maxTokens, false)
		}},
		{"bare, done from the stream", func(ctx context.Context, i int, q string) (time.Duration, time.Duration, error) {
			return bareRun(ctx, rt.Temporal, rt.Redis, bareQueue, fmt.Sprintf("bare-inline-%d-%d", time.Now().UnixNano(), i), prompts[q], maxTokens, true)
		}},
		{"sluice", func(ctx context.Context, _ int, q string) (time.Duration, time.Duration, error) {
			return sluice(ctx, baseURL, q, maxTokens)
		}},
	}
	ttfts := make([][]time.Duration, len(paths))
	totals := make([][]time.Duration, len(paths))
	// Paths run in a shuffled order each round, with a pause before each
	// request, so that no path always follows another's background work on
	// the shared server (persistence, visibility) and pays for it.
	rng := rand.New(rand.NewPCG(1, 2))
	order := make([]int, len(paths))
	for i := range order {
		order[i] = i
	}
	for i := 0; i < warmup+n; i++ {
		q := queries[i%len(queries)]
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, p := range order {
			path := paths[p]
			time.Sleep(gap)
			ttft, total, err := path.run(ctx, i, q)
			if err != nil {
				return fmt.Errorf("%s request %d: %w", path.name, i, err)
			}
			if i >= warmup {
				ttfts[p] = append(ttfts[p], ttft)
				totals[p] = append(totals[p], total)
			}
		}
	}

	fmt.Printf("sluice-bench: %d sequential requests per path after %d warm-up, %d-token answers, paths shuffled per round, %v pause before each request\n\n", n, warmup, maxTokens, gap)
	fmt.Println("| path | TTFT p50 | TTFT p99 | total p50 | total p99 |")
	fmt.Println("|---|---|---|---|---|")
	for p, path := range paths {
		fmt.Printf("| %s | %s | %s | %s | %s |\n", path.name, ms(sorted(ttfts[p]).at(50)), ms(sorted(ttfts[p]).at(99)), ms(sorted(totals[p]).at(50)), ms(sorted(totals[p]).at(99)))
	}
	d, bt, bi, s := 0, 1, 2, 3
	fmt.Println()
	fmt.Printf("added TTFT p50, sluice vs direct LLM:        %s (goal <= 30 ms)\n", ms(sorted(ttfts[s]).at(50)-sorted(ttfts[d]).at(50)))
	fmt.Printf("added TTFT p50, bare Temporal vs direct LLM: %s\n", ms(sorted(ttfts[bt]).at(50)-sorted(ttfts[d]).at(50)))
	ov := sorted(totals[s]).at(50) - sorted(totals[d]).at(50)
	bov := sorted(totals[bt]).at(50) - sorted(totals[d]).at(50)
	biov := sorted(totals[bi]).at(50) - sorted(totals[d]).at(50)
	fmt.Printf("orchestration overhead p50 (total - direct): sluice %s, bare %s, ratio %.2fx (goal <= 1.25x)\n", ms(ov), ms(bov), float64(ov)/float64(bov))
	fmt.Printf("  vs the bare workflow that also writes done from the stream: %s, ratio %.2fx\n", ms(biov), float64(ov)/float64(biov))
	fmt.Printf("end-to-end p50 ratio sluice/bare: %.2fx\n", float64(sorted(totals[s]).at(50))/float64(sorted(totals[bt]).at(50)))
	return nil
}

func samePrompt(ctx context.Context, rt *worker.Runtime, cfg config.Config, q string) ([]llm.Message, error) {
	vec, _, err := rt.Activities.Embeddings.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	res, _, err := rt.Activities.Retriever.Retrieve(ctx, retrieval.Query{KB: cfg.Retrieval.DefaultKB, Text: q, Vector: vec, K: cfg.Retrieval.Candidates})
	if err != nil {
		return nil, err
	}
	chunks, err := rt.Activities.Reranker.Rerank(ctx, q, res.Chunks, cfg.Retrieval.TopK)
	if err != nil {
		return nil, err
	}
	return rt.Prompts.Messages(chunks, q), nil
}

func direct(ctx context.Context, s llm.Streamer, msgs []llm.Message, maxTokens int) (time.Duration, time.Duration, error) {
	start := time.Now()
	var ttft time.Duration
	_, err := s.Stream(ctx, llm.Request{Model: "sluice-sim", Messages: msgs, MaxTokens: maxTokens}, func(string) error {
		if ttft == 0 {
			ttft = time.Since(start)
		}
		return nil
	})
	return ttft, time.Since(start), err
}

func sluice(ctx context.Context, baseURL, q string, maxTokens int) (time.Duration, time.Duration, error) {
	start := time.Now()
	if trace {
		defer func() { fmt.Printf("sluice request took %v\n", time.Since(start)) }()
	}
	body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, q, maxTokens)
	resp, err := http.Post(baseURL+"/v1/chat", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	r := testenv.NewSSEReader(resp.Body)
	var ttft time.Duration
	for {
		ev, err := r.Next()
		if err != nil {
			return 0, 0, fmt.Errorf("stream ended early: %w", err)
		}
		if trace {
			fmt.Printf("%7.2fms %s %s\n", float64(time.Since(start))/1e6, ev.Event, ev.Data)
		}
		switch ev.Event {
		case "token":
			if ttft == 0 {
				ttft = time.Since(start)
			}
		case "done":
			return ttft, time.Since(start), nil
		case "rejected", "error":
			return 0, 0, fmt.Errorf("%s: %s", ev.Event, ev.Data)
		}
	}
}

// BareInput is the bare workflow's input.
type BareInput struct {
	ID        string
	Messages  []llm.Message
	MaxTokens int
	// InlineDone makes the streaming activity write "done" itself, as
	// Sluice's does, instead of a local activity after it.
	InlineDone bool
}

// BareWorkflow has ChatWorkflow's shape and none of its work.
func BareWorkflow(ctx workflow.Context, in BareInput) error {
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 5 * time.Second})
	for i := 0; i < 4; i++ {
		if err := workflow.ExecuteLocalActivity(lctx, "noop", i).Get(lctx, nil); err != nil {
			return err
		}
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute, HeartbeatTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var b *bare
	if err := workflow.ExecuteActivity(actx, b.BareStream, in).Get(actx, nil); err != nil {
		return err
	}
	if in.InlineDone {
		return nil
	}
	return workflow.ExecuteLocalActivity(lctx, b.BareDone, in.ID).Get(lctx, nil)
}

func noop(_ context.Context, i int) (int, error) { return i, nil }

type bare struct {
	rdb *redis.Client
	llm llm.Streamer
}

func (b *bare) BareStream(ctx context.Context, in BareInput) error {
	_, err := b.llm.Stream(ctx, llm.Request{Model: "sluice-sim", Messages: in.Messages, MaxTokens: in.MaxTokens}, func(text string) error {
		activity.RecordHeartbeat(ctx)
		return b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: "bench:" + in.ID, Values: []any{"t", "token", "d", text}}).Err()
	})
	if err != nil || !in.InlineDone {
		return err
	}
	return b.BareDone(ctx, in.ID)
}

func (b *bare) BareDone(ctx context.Context, id string) error {
	return b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: "bench:" + id, Values: []any{"t", "done"}}).Err()
}

func bareRun(ctx context.Context, c client.Client, rdb *redis.Client, queue, id string, msgs []llm.Message, maxTokens int, inlineDone bool) (time.Duration, time.Duration, error) {
	start := time.Now()
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue, EnableEagerStart: true},
		BareWorkflow, BareInput{ID: id, Messages: msgs, MaxTokens: maxTokens, InlineDone: inlineDone})
	if err != nil {
		return 0, 0, err
	}
	if trace {
		fmt.Printf("%7.2fms bare started\n", float64(time.Since(start))/1e6)
	}
	defer rdb.Del(context.Background(), "bench:"+id)
	var ttft time.Duration
	last := "0"
	for {
		res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{"bench:" + id, last}, Block: 30 * time.Second}).Result()
		if err != nil {
			return 0, 0, fmt.Errorf("read bare stream: %w", err)
		}
		for _, m := range res[0].Messages {
			last = m.ID
			if trace {
				fmt.Printf("%7.2fms bare %v\n", float64(time.Since(start))/1e6, m.Values["t"])
			}
			switch m.Values["t"] {
			case "token":
				if ttft == 0 {
					ttft = time.Since(start)
				}
			case "done":
				return ttft, time.Since(start), nil
			}
		}
	}
}
