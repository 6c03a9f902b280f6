package workflows

import (
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/request"
)

// maxReadmits bounds how often a request whose permit expired before its
// stream started queues again.
const maxReadmits = 3

// stream calls the LLM with the reranked context. A request whose permit
// expired before its stream started (nothing was streamed) goes back to
// the queue at its old place, up to maxReadmits times.
func (w *chat) stream(ctx workflow.Context, kbVersion int64, hits []activities.ChunkRef) {
	w.status.Stage = request.StageLLM
	lctx := w.llmCtx()
	var out activities.LLMOutput
	var err error
	for readmits := 0; ; {
		out, err = w.streamOnce(lctx, kbVersion, hits)
		if err == nil {
			break
		}
		if readmits < maxReadmits && isPermitLost(err) {
			readmits++
			// Nothing was streamed: a request that ends while it queues
			// again gets its whole charge back.
			w.used = &activities.Used{}
			if !w.admit(ctx) {
				return
			}
			w.status.Stage = request.StageLLM
			continue
		}
		next, ended := w.fallBack(ctx, err)
		if ended {
			return
		}
		if !next {
			break
		}
		w.status.Stage = request.StageLLM
	}
	if err != nil {
		w.used = streamedBefore(err)
		w.billed = partialUsage(err)
		w.stageFailed(request.StageLLM, err)
		return
	}
	w.answered(out)
}

// llmCtx is the LLM activity's options: a regular activity that
// heartbeats, retried only while nothing was streamed.
func (w *chat) llmCtx() workflow.Context {
	return workflow.WithActivityOptions(w.stageCtx, workflow.ActivityOptions{
		StartToCloseTimeout: w.in.Settings.LLMTimeout,
		HeartbeatTimeout:    w.in.Settings.LLMHeartbeat,
		// Wait for the stream to really stop before its permit is released.
		WaitForCancellation: true,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:    200 * time.Millisecond,
			BackoffCoefficient: 2,
			MaximumInterval:    2 * time.Second,
			MaximumAttempts:    int32(w.in.Settings.LLMMaxAttempts),
			NonRetryableErrorTypes: []string{
				activities.ErrTypeStreamInterrupted, activities.ErrTypeCancelled, activities.ErrTypeBadRequest,
			},
		},
	})
}

// streamOnce runs the LLM activity once (with its own retries). While it
// runs, a cancel also raises the stream's stop flag.
func (w *chat) streamOnce(lctx workflow.Context, kbVersion int64, hits []activities.ChunkRef) (activities.LLMOutput, error) {
	w.llmRunning = true
	w.used = nil
	var out activities.LLMOutput
	err := workflow.ExecuteActivity(lctx, a.StreamLLM, activities.LLMInput{
		RequestID: w.in.RequestID, Pool: w.pool, Query: w.in.Query,
		KB: w.in.KBRef().Key(), KBVersion: kbVersion, Context: hits, MaxTokens: w.in.MaxTokens,
		Done: w.doneFacts(), Session: w.session(), CacheAnswer: w.in.Settings.AnswerCache,
		Conversation: w.in.Conversation, Gateway: w.in.Gateway, Sampling: w.in.Sampling, Choices: w.in.Choices,
		Model: w.llmModel, FallBack: w.fallbackLeft(), ServiceTier: w.in.ServiceTier,
		Weight: w.in.Settings.Weight, MaxConcurrent: w.in.Settings.MaxConcurrent,
	}).Get(lctx, &out)
	w.llmRunning = false
	return out, err
}

// answered records a finished stream as the request's result.
func (w *chat) answered(out activities.LLMOutput) {
	w.used = &activities.Used{Tokens: out.Usage.TotalTokens, Requests: 1}
	w.timing(request.StageLLMFirstToken, out.FirstTokenMs, "")
	w.timing(request.StageLLM, out.Ms, "")
	w.doneWritten = out.DoneWritten
	w.turnRecorded = out.TurnRecorded

	w.result.Outcome = request.OutcomeDone
	w.result.Reason = ""
	w.result.Usage = out.Usage
	w.billed = out.Usage
	w.model = out.Model
	w.result.FinishReason = out.FinishReason
	w.result.Sources = out.Sources
	w.result.ContextShed = out.ContextShed
	w.result.Fallback = w.fallback
}

// isPermitLost reports a stream that could not start because its permit's
// lease ran out first.
func isPermitLost(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == activities.ErrTypePermitLost
}
