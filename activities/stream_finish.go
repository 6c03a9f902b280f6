package activities

import (
	"context"
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// finishAnswer completes a stream that ended well: it ends a truncated
// answer with the notice, records the answer in its session, writes the
// done event and keeps a complete answer in the L3 tier. pauses is how
// often the stream was paused for a more urgent request.
func (a *Chat) finishAnswer(ctx context.Context, in LLMInput, res llm.Result, p *fittedPrompt, s *tokenStream, pauses int) (LLMOutput, error) {
	usage := a.usageOf(res, p, s.tokens())
	if err := a.noteTruncations(ctx, in.RequestID, res, s); err != nil {
		return LLMOutput{}, err
	}
	out := LLMOutput{
		Usage: usage, FinishReason: res.FinishReason, FinishReasons: res.Finishes,
		Sources: sources(p.chunks), ContextShed: len(in.Context) - len(p.chunks),
		FirstTokenMs: s.firstToken.Milliseconds(), Ms: time.Since(s.start).Milliseconds(), Model: res.Model,
		Failovers: streamFailovers(res.Failovers), Pauses: pauses,
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
		a.releaseEarly(ctx, in, a.Options.usedCost(usage.PromptTokens, usage.CompletionTokens))
	}
	if in.CacheAnswer && res.FinishReason == "stop" {
		a.cacheAnswer(ctx, in, out, s.answer)
	}
	return out, nil
}

// usageOf is a completed stream's usage: as the backend reported it, or
// else counted here.
func (a *Chat) usageOf(res llm.Result, p *fittedPrompt, tokens int) events.Usage {
	var usage events.Usage
	if res.UsageReported {
		usage = events.Usage{
			PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens, Reported: true,
		}
	} else {
		usage = events.Usage{PromptTokens: a.promptTokens(p), CompletionTokens: tokens}
	}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	return usage
}

// noteTruncations ends each answer the model stopped at max tokens, maybe
// mid-word, with the truncation notice: the first's, or each choice's
// when several were asked for. The notice is a token event marked as one
// (events.Token.Notice), which only the native API shows.
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
		tok := events.Token{Text: a.Options.TruncationNotice, Index: s.tokens(), Choice: choice, Notice: true}
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
		Sources: out.Sources, ContextShed: out.ContextShed, Model: out.Model, Pauses: out.Pauses,
		Timings: []events.StageTiming{
			{Stage: request.StageLLMFirstToken, Ms: out.FirstTokenMs},
			{Stage: request.StageLLM, Ms: out.Ms},
		},
	}
}

// releaseEarly gives back the permit of a stream whose answer is whole and
// written: the backend is done with it. Handing it to the next waiter now,
// rather than in the workflow's Finalize after this activity's completion
// has gone through the server, saves a waiter a server round trip and a
// workflow task of waiting. Finalize's release is then a no-op (releases
// are idempotent). A failure here only leaves the release to Finalize.
// The tokens the answer used settle what admission charged its tenant.
func (a *Chat) releaseEarly(ctx context.Context, in LLMInput, used float64) {
	_, err := a.Gate.ReleaseUsedAndWake(ctx, a.Notifier, in.Pool, in.RequestID, used)
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
