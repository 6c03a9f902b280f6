package activities

import (
	"context"
	"encoding/json"
	"fmt"
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
// done event and keeps a complete answer in the L3 tier.
func (a *Chat) finishAnswer(ctx context.Context, in LLMInput, res llm.Result, p *fittedPrompt, s *tokenStream) (LLMOutput, error) {
	tokens := s.tokens()
	usage := a.usageOf(res, p, tokens)
	if res.FinishReason == "length" && a.Options.TruncationNotice != "" {
		// The model stopped at max tokens, maybe mid-word: say so.
		if _, err := a.writeToken(ctx, in.RequestID, tokens, a.Options.TruncationNotice, s.stopKey); err != nil {
			return LLMOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeStreamInterrupted, err)
		}
		if s.keep {
			s.answer = append(s.answer, a.Options.TruncationNotice)
		}
	}
	out := LLMOutput{
		Usage: usage, FinishReason: res.FinishReason,
		Sources: sources(p.chunks), ContextShed: len(in.Context) - len(p.chunks),
		FirstTokenMs: s.firstToken.Milliseconds(), Ms: time.Since(s.start).Milliseconds(),
	}
	if in.Session != nil {
		out.TurnRecorded = a.recordAnswer(ctx, in, res.FinishReason, s.answer)
	}
	// The client gets its done event now, not after this activity's
	// completion has gone through the server to the workflow; the workflow
	// then only gives back the permit.
	if in.Done != nil {
		done := completeDone(*in.Done, out)
		if _, err := a.Events.Append(ctx, in.RequestID, events.TypeDone, done); err != nil {
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

// completeDone fills the done event the workflow started with what the
// stream measured.
func completeDone(d events.Done, out LLMOutput) events.Done {
	d.Timings = append(append([]events.StageTiming(nil), d.Timings...),
		events.StageTiming{Stage: request.StageLLMFirstToken, Ms: out.FirstTokenMs},
		events.StageTiming{Stage: request.StageLLM, Ms: out.Ms})
	d.FinishReason = out.FinishReason
	d.Usage = out.Usage
	d.Sources = out.Sources
	d.ContextShed = out.ContextShed
	return d
}

// afterLostAttempt handles a retry of a stream whose previous attempt
// streamed tokens and was then lost (its worker died, or its completion
// never reached the server). If that attempt already wrote the done event,
// the answer is complete and this attempt reports it; otherwise the client
// has a prefix that no model can continue, and the request fails.
func (a *Chat) afterLostAttempt(ctx context.Context, in LLMInput, p streamProgress) (LLMOutput, error) {
	out, answered, err := a.answeredBefore(ctx, in)
	if err != nil || answered {
		return out, err
	}
	return LLMOutput{}, temporal.NewNonRetryableApplicationError(
		fmt.Sprintf("previous attempt streamed %d tokens before it was lost", p.Tokens), ErrTypeStreamInterrupted, nil)
}

// answeredBefore reports whether an earlier attempt of the stream already
// wrote the done event, and what it reported there.
func (a *Chat) answeredBefore(ctx context.Context, in LLMInput) (LLMOutput, bool, error) {
	last, ok, err := a.Events.Last(ctx, in.RequestID)
	if err != nil {
		return LLMOutput{}, false, err
	}
	var done events.Done
	if !ok || last.Type != events.TypeDone || json.Unmarshal(last.Data, &done) != nil {
		return LLMOutput{}, false, nil
	}
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
	return out, true, nil
}

// releaseEarly gives back the permit of a stream whose answer is whole and
// written: the backend is done with it. Handing it to the next waiter now,
// rather than in the workflow's Finalize after this activity's completion
// has gone through the server, saves a waiter a server round trip and a
// workflow task of waiting. Finalize's release is then a no-op (releases
// are idempotent). A failure here only leaves the release to Finalize.
func (a *Chat) releaseEarly(ctx context.Context, in LLMInput) {
	rel, err := a.Gate.Release(ctx, in.Pool, in.RequestID)
	if err != nil {
		a.logger(in.RequestID).Warn("give back the permit after the answer; Finalize will", "err", err)
		return
	}
	if err := admission.Wake(ctx, a.Gate, a.Notifier, in.Pool, rel.Woken); err != nil {
		a.logger(in.RequestID).Warn("wake granted waiters", "err", err)
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
