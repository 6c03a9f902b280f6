package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// finishAnswer completes a stream that ended well: it ends a truncated
// answer with the notice, records the answer in its session, writes the
// done event and keeps a complete answer in the L3 tier.
func (a *Chat) finishAnswer(ctx context.Context, in LLMInput, res llm.Result, p *fittedPrompt, s *tokenStream) (LLMOutput, error) {
	usage := a.usageOf(res, p, s.tokens())
	if err := a.noteTruncations(ctx, in.RequestID, res, s); err != nil {
		return LLMOutput{}, err
	}
	out := LLMOutput{
		Usage: usage, FinishReason: res.FinishReason, FinishReasons: res.Finishes,
		Sources: sources(p.chunks), ContextShed: len(in.Context) - len(p.chunks),
		FirstTokenMs: s.firstToken.Milliseconds(), Ms: time.Since(s.start).Milliseconds(), Model: res.Model,
	}
	if in.Session != nil {
		out.TurnRecorded = a.recordAnswer(ctx, in, res.FinishReason, s.answer)
	}
	// The client gets its done event now, not after this activity's
	// completion has gone through the server to the workflow; the workflow
	// then only gives back the permit.
	if in.Done != nil {
		done := doneEvent(ctx, *in.Done, streamedAnswer(out))
		if err := a.writeDone(ctx, in.RequestID, done); err != nil {
			// Tokens were streamed: a retry would fail as interrupted.
			return LLMOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeStreamInterrupted, err)
		}
		out.DoneWritten = true
		a.releaseEarly(ctx, in)
	}
	if in.CacheAnswer && res.FinishReason == "stop" {
		a.cacheAnswer(ctx, in, out, s.answer)
	}
	return out, nil
}

// noteTruncations ends each answer the model stopped at max tokens, maybe
// mid-word, with the truncation notice: the first's, or each choice's
// when several were asked for.
func (a *Chat) noteTruncations(ctx context.Context, requestID string, res llm.Result, s *tokenStream) error {
	if a.Options.TruncationNotice == "" {
		return nil
	}
	finishes := res.Finishes
	if len(finishes) < 2 {
		finishes = []string{res.FinishReason}
	}
	for choice, reason := range finishes {
		if reason != "length" {
			continue
		}
		tok := events.Token{Text: a.Options.TruncationNotice, Index: s.tokens(), Choice: choice}
		if _, err := a.writeToken(ctx, requestID, tok, s.stopKey); err != nil {
			return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeStreamInterrupted, err)
		}
		s.n.Add(1)
		if s.keep {
			s.answer = append(s.answer, a.Options.TruncationNotice)
		}
	}
	return nil
}

// writeDone writes the answer's done event, retrying as token writes do
// while Redis stalls; AppendFinal writes one end however often it is
// retried.
func (a *Chat) writeDone(ctx context.Context, requestID string, done events.Done) error {
	return patiently(ctx, func() error {
		_, _, err := a.Events.AppendFinal(ctx, requestID, events.TypeDone, done)
		return err
	})
}

// streamedAnswer is the answer a completed stream reports in out.
func streamedAnswer(out LLMOutput) Answer {
	return Answer{
		FinishReason: out.FinishReason, FinishReasons: out.FinishReasons, Usage: out.Usage,
		Sources: out.Sources, ContextShed: out.ContextShed, Model: out.Model,
		Timings: []events.StageTiming{
			{Stage: request.StageLLMFirstToken, Ms: out.FirstTokenMs},
			{Stage: request.StageLLM, Ms: out.Ms},
		},
	}
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

// releaseEarly gives back the permit of a stream whose answer is whole and
// written: the backend is done with it. Handing it to the next waiter now,
// rather than in the workflow's Finalize after this activity's completion
// has gone through the server, saves a waiter a server round trip and a
// workflow task of waiting. Finalize's release is then a no-op (releases
// are idempotent). A failure here only leaves the release to Finalize.
func (a *Chat) releaseEarly(ctx context.Context, in LLMInput) {
	_, err := a.Gate.ReleaseAndWake(ctx, a.Notifier, in.Pool, in.RequestID)
	switch {
	case errors.Is(err, admission.ErrNotWoken):
		a.logger(in.RequestID).Warn("wake granted waiters", "err", err)
	case err != nil:
		a.logger(in.RequestID).Warn("give back the permit after the answer; Finalize will", "err", err)
	}
}

// sources are the documents of chunks, each once, in the chunks' order.
func sources(chunks []retrieval.Chunk) []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range chunks {
		if !seen[c.DocID] {
			seen[c.DocID] = true
			out = append(out, c.DocID)
		}
	}
	return out
}
