package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/request"
)

// priorAttempt is StreamLLM's resume step: a retried attempt (or one
// resumed from a heartbeat) first reads what earlier attempts left in the
// request's event stream, so that an answer is never streamed twice. A
// first attempt has nothing before it.
func (a *Chat) priorAttempt(ctx context.Context, requestID string) (priorStream, error) {
	if activity.GetInfo(ctx).Attempt == 1 && !activity.HasHeartbeatDetails(ctx) {
		return priorStream{}, nil
	}
	return a.readPriorStreamPatiently(ctx, requestID)
}

// priorStream is what earlier attempts of a stream left in the request's
// event stream: a done event, or the tokens its client already has.
type priorStream struct {
	done *events.Done
	// tokens is how many tokens were written (the last one's index + 1).
	tokens int
}

// priorTail is how many of the newest events readPriorStream looks at:
// once tokens flow, only tokens and the done event follow them, so the
// newest token or done is among the last few events if there is one.
const priorTail = 16

// priorStreamWait bounds how long a retried stream waits for its event
// stream's Redis to answer: longer than a Redis Cluster failover (node
// timeout plus the election). Without it the retries, two seconds apart,
// run out while a master is replaced, and the request fails.
const priorStreamWait = 20 * time.Second

// readPriorStreamPatiently is readPriorStream, tried again while Redis
// does not answer, heartbeating the progress the earlier attempt reported
// so that the attempt is neither timed out nor loses that progress.
func (a *Chat) readPriorStreamPatiently(ctx context.Context, requestID string) (priorStream, error) {
	var hb streamProgress
	if activity.HasHeartbeatDetails(ctx) {
		_ = activity.GetHeartbeatDetails(ctx, &hb)
	}
	deadline := time.Now().Add(priorStreamWait)
	for {
		p, err := a.readPriorStream(ctx, requestID)
		var appErr *temporal.ApplicationError
		if err == nil || errors.As(err, &appErr) || time.Now().After(deadline) {
			return p, err
		}
		activity.RecordHeartbeat(ctx, hb)
		select {
		case <-ctx.Done():
			return p, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// readPriorStream reads how an earlier attempt of this stream ended from
// the request's event stream. That is what the client reads, so it is the
// truth about what the client has; the heartbeat detail an attempt leaves
// trails its tokens by up to the heartbeat throttle (seconds), and a
// retry trusting it could append a second answer to the first's prefix.
func (a *Chat) readPriorStream(ctx context.Context, requestID string) (priorStream, error) {
	evs, err := a.Events.Tail(ctx, requestID, priorTail)
	if err != nil {
		return priorStream{}, err
	}
	for _, ev := range evs {
		switch ev.Type {
		case events.TypeDone:
			var done events.Done
			if err := json.Unmarshal(ev.Data, &done); err != nil {
				return priorStream{}, temporal.NewNonRetryableApplicationError(
					fmt.Sprintf("read the done event an earlier attempt wrote: %v", err), ErrTypeStreamInterrupted, err)
			}
			return priorStream{done: &done}, nil
		case events.TypeToken:
			var tok events.Token
			if err := json.Unmarshal(ev.Data, &tok); err != nil {
				return priorStream{}, temporal.NewNonRetryableApplicationError(
					fmt.Sprintf("read the token an earlier attempt wrote: %v", err), ErrTypeStreamInterrupted, err)
			}
			return priorStream{tokens: tok.Index + 1}, nil
		}
	}
	return priorStream{}, nil
}

// answered is the output of a stream whose earlier attempt finished the
// answer and wrote its done event, then was lost before reporting it.
func (p priorStream) answered() LLMOutput {
	done := p.done
	out := LLMOutput{
		Usage: done.Usage, FinishReason: done.FinishReason, Sources: done.Sources,
		ContextShed: done.ContextShed, DoneWritten: true,
	}
	for _, t := range done.Timings {
		switch t.Stage {
		case request.StageLLMFirstToken:
			out.FirstTokenMs = t.Ms
		case request.StageLLM:
			out.Ms = t.Ms
		}
	}
	return out
}

// interruptedBefore ends a stream whose earlier attempt streamed tokens
// and was lost (its worker died, or its completion never reached the
// server): the client has a prefix that no model can continue. What that
// attempt consumed goes with the error, so the request is billed for it
// once: the prompt as this attempt would have sent it, and the tokens
// written.
func (a *Chat) interruptedBefore(log *slog.Logger, tokens int, p *fittedPrompt) error {
	log.Warn("an earlier attempt streamed tokens and was lost; the answer is interrupted", "tokens", tokens)
	promptTokens := a.promptTokens(p)
	return temporal.NewNonRetryableApplicationError(
		fmt.Sprintf("an earlier attempt streamed %d tokens before it was lost", tokens), ErrTypeStreamInterrupted, nil,
		events.Usage{PromptTokens: promptTokens, CompletionTokens: tokens, TotalTokens: promptTokens + tokens})
}

// resumeReadBatch is how many events resumable reads from Redis at once.
const resumeReadBatch = 256

// resumable reads back the answer an earlier attempt streamed before it
// was lost, token by token from the request's event stream (what the
// client has), for the pool to continue. It is nil, and the answer ends
// interrupted, when the pool's backend cannot continue one, or the answer
// is not text alone (tool calls, several choices, the truncation notice
// of a finished answer), or its tokens cannot be read whole.
func (a *Chat) resumable(ctx context.Context, log *slog.Logger, in LLMInput, pool Pool, tokens int) *llm.Resume {
	if !pool.Continues || in.Choices > 1 {
		return nil
	}
	var text strings.Builder
	next, after := 0, ""
	for next < tokens {
		evs, err := a.Events.After(ctx, in.RequestID, after, resumeReadBatch)
		if err != nil || len(evs) == 0 {
			log.Warn("read back the answer a lost attempt streamed", "tokens", tokens, "read", next, "err", err)
			return nil
		}
		for _, ev := range evs {
			after = ev.ID
			if ev.Type != events.TypeToken {
				continue
			}
			var tok events.Token
			if json.Unmarshal(ev.Data, &tok) != nil || tok.Notice || tok.Choice != 0 || len(tok.ToolCalls) > 0 || tok.Index > next {
				return nil
			}
			// A retried write may have appended a token twice.
			if tok.Index == next {
				text.WriteString(tok.Text)
				next++
			}
		}
	}
	log.Warn("an earlier attempt streamed tokens and was lost; resuming its answer", "tokens", tokens)
	return &llm.Resume{Text: text.String(), Pieces: tokens}
}
