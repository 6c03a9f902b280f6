// Package bare is a bare Temporal workflow of Sluice's shape and none of
// its work: four no-op local activities, one activity streaming the
// answer into a Redis stream, and done written after it (or from the
// stream, as Sluice writes it). The overhead and goodput scenarios
// measure Sluice against it on the same stack.
package bare

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
)

var Trace = os.Getenv("BENCH_TRACE") == "1"

const Queue = "sluice-bench-bare"

// Setup is a running worker of the bare workflow, and the prompts it
// is to send.
type Setup struct {
	*Activities
	Worker sdkworker.Worker
	// Prompts are chat.Queries' prompts as Sluice builds them (the
	// same retrieval stack, retrieved context included), so that the
	// bare paths send the simulator exactly what Sluice sends it.
	Prompts map[string][]openai.Message
}

// Start starts a worker of the bare workflow on the bench's own
// Temporal client (the stack's second runtime), streaming from the short
// pool's backend through the pool's own client.
func Start(ctx context.Context, st *stack.Stack) (*Setup, error) {
	rt := st.Core
	b := &Setup{Activities: &Activities{rdb: rt.Redis, LLM: rt.Chat.Pools[request.PoolShort].Streamer}, Prompts: map[string][]openai.Message{}}
	for _, q := range chat.Queries {
		msgs, err := st.Prompt(ctx, q)
		if err != nil {
			return nil, err
		}
		b.Prompts[q] = msgs
	}
	b.Worker = sdkworker.New(rt.Temporal, Queue, sdkworker.Options{})
	b.Worker.RegisterWorkflow(BareWorkflow)
	b.Worker.RegisterActivity(b.Activities)
	b.Worker.RegisterActivityWithOptions(noop, activity.RegisterOptions{Name: "noop"})
	if err := b.Worker.Start(); err != nil {
		return nil, err
	}
	return b, nil
}

// BareInput is the bare workflow's input.
type BareInput struct {
	ID        string
	Messages  []openai.Message
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
	var b *Activities
	if err := workflow.ExecuteActivity(actx, b.BareStream, in).Get(actx, nil); err != nil {
		return err
	}
	if in.InlineDone {
		return nil
	}
	return workflow.ExecuteLocalActivity(lctx, b.BareDone, in.ID).Get(lctx, nil)
}

func noop(_ context.Context, i int) (int, error) { return i, nil }

type Activities struct {
	rdb redis.UniversalClient
	LLM llm.Streamer
}

func (b *Activities) BareStream(ctx context.Context, in BareInput) error {
	_, err := b.LLM.Stream(ctx, llm.Request{Model: "sluice-sim", Messages: in.Messages, MaxTokens: in.MaxTokens}, func(d llm.Delta) error {
		activity.RecordHeartbeat(ctx)
		return b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: "bench:" + in.ID, Values: []any{"t", "token", "d", d.Text}}).Err()
	})
	if err != nil || !in.InlineDone {
		return err
	}
	return b.BareDone(ctx, in.ID)
}

func (b *Activities) BareDone(ctx context.Context, id string) error {
	return b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: "bench:" + id, Values: []any{"t", "done"}}).Err()
}

func Run(ctx context.Context, c client.Client, rdb redis.UniversalClient, queue, id string, msgs []openai.Message, maxTokens int, inlineDone bool) (time.Duration, time.Duration, error) {
	start := time.Now()
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue, EnableEagerStart: true},
		BareWorkflow, BareInput{ID: id, Messages: msgs, MaxTokens: maxTokens, InlineDone: inlineDone})
	if err != nil {
		return 0, 0, err
	}
	if Trace {
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
			if Trace {
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
