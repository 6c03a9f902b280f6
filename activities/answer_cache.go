package activities

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/pkg/answercache"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// LookupAnswer serves the request from the L3 tier if its question was
// answered before at the kb's current version: it streams the answer and
// the done event (marked cached) itself. It runs before admission, so a
// hit takes no permit; the key names the model of the pool admission
// would route the request to, as the stream that cached the answer did.
func (a *Chat) LookupAnswer(ctx context.Context, in LookupAnswerInput) (LookupAnswerOutput, error) {
	start := time.Now()
	version, err := a.KBVersions.Version(ctx, in.KB)
	if err != nil {
		return LookupAnswerOutput{}, fmt.Errorf("read version of kb %s: %w", in.KB, err)
	}
	bound := in.PromptBound
	if bound == 0 {
		bound = a.promptBound(in.Query)
	}
	pool := in.Pool
	if pool == "" {
		// Requests with a session never get here: no history to count.
		pool = request.Route(bound, 0, a.Options.ShortThreshold)
	}
	ans, hit, err := a.Answers.Get(ctx, a.answerKey(in.Query, in.KB, version, pool), in.MaxTokens)
	if err != nil || !hit {
		return LookupAnswerOutput{PromptBound: bound, KBVersion: version, Ms: time.Since(start).Milliseconds()}, err
	}
	out := LookupAnswerOutput{
		Hit: true, PromptBound: bound, KBVersion: version, FinishReason: ans.FinishReason,
		Sources: ans.Sources, ContextShed: ans.ContextShed, CachedTokens: ans.Usage.CompletionTokens,
	}
	out.Ms = time.Since(start).Milliseconds()
	facts := DoneFacts{RequestID: in.RequestID}
	if in.Done != nil {
		facts = *in.Done
	}
	facts.Route = request.RouteCache
	// The answer cost no LLM tokens this time: its usage is zero.
	done := doneEvent(ctx, facts, Answer{
		FinishReason: ans.FinishReason, Sources: ans.Sources, ContextShed: ans.ContextShed,
		Cached: true, KBVersion: version,
		Timings: []events.StageTiming{{Stage: request.StageAnswerCache, Ms: out.Ms, Cache: "hit"}},
	})
	toks := make([]events.Pending, len(ans.Tokens))
	for i, text := range ans.Tokens {
		toks[i] = events.Pending{Type: events.TypeToken, Data: events.Token{Text: text, Index: i}}
	}
	// With its end, once: a retried lookup (an earlier attempt wrote the
	// answer and lost only its reply) finds the end and writes nothing.
	if _, _, err := a.Events.AppendFinalAfter(ctx, in.RequestID, toks, events.TypeDone, done); err != nil {
		return LookupAnswerOutput{}, err
	}
	return out, nil
}

// answerKey is the L3 key of a query to a kb version, asked of pool.
func (a *Chat) answerKey(query, kb string, version int64, pool string) answercache.Key {
	return answercache.Key{Query: query, KB: kb, KBVersion: version, Model: a.Pools[pool].Model, Prompt: a.Prompts.Version()}
}

// cacheAnswer keeps a complete answer in the L3 tier. A failure only
// costs a later request its hit.
func (a *Chat) cacheAnswer(ctx context.Context, in LLMInput, out LLMOutput, answer []string) {
	err := a.Answers.Put(ctx, a.answerKey(in.Query, in.KB, in.KBVersion, in.Pool), answercache.Answer{
		Tokens: answer, FinishReason: out.FinishReason, Usage: out.Usage, Sources: out.Sources,
		ContextShed: out.ContextShed, RequestID: in.RequestID, CreatedAt: time.Now().UTC(),
	})
	if err != nil {
		a.logger(in.RequestID).Warn("keep answer in the answer cache", "err", err)
	}
}
