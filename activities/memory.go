package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/sluice-dev/sluice/pkg/answercache"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
)

// history returns the session's newest turns that fit its token budget,
// and the tokens they add to a prompt. A session that cannot be read is
// asked without its history: memory makes answers better, its absence
// does not make them wrong. Admit (to route by the tokens) and StreamLLM
// (to build the prompt) each read it: handing the turns from one to the
// other would put up to history_tokens of text into the workflow's history
// for every request, a bigger cost than one more Redis read.
func (a *Chat) history(ctx context.Context, requestID string, ref *SessionRef) ([]prompt.Exchange, int) {
	if ref == nil || ref.HistoryTokens <= 0 || a.Sessions == nil {
		return nil, 0
	}
	ex, n, err := a.Sessions.History(ctx, a.Prompts, ref.Tenant, ref.ID, ref.HistoryTokens)
	if err != nil {
		a.logger(requestID).Warn("read session; asking without its history", "session", ref.ID, "err", err)
		return nil, 0
	}
	return ex, n
}

// recordAnswer records a finished stream's answer in its session before
// the client is told the answer is done. It reports whether that worked;
// if not, Finalize records the turn from the event stream.
func (a *Chat) recordAnswer(ctx context.Context, in LLMInput, finishReason string, answer []string) bool {
	if a.Sessions == nil {
		return false
	}
	outcome := request.OutcomeDone
	if finishReason == "length" {
		outcome = request.OutcomeTruncated
	}
	err := a.Sessions.Append(ctx, in.Session.Tenant, in.Session.ID, session.Turn{
		RequestID: in.RequestID, Query: in.Query, Answer: strings.Join(answer, ""),
		Outcome: outcome, At: time.Now().UTC(),
	})
	if err != nil {
		a.logger(in.RequestID).Warn("record answer in session", "session", in.Session.ID, "err", err)
		return false
	}
	return true
}

// recordTurn records a finished request in its session; a done request's
// answer is read back from its event stream.
func (a *Chat) recordTurn(ctx context.Context, in FinalizeInput) error {
	t := session.Turn{
		RequestID: in.RequestID, Query: in.Turn.Query, Outcome: in.Turn.Outcome,
		Reason: in.Turn.Reason, At: time.Now().UTC(),
	}
	if t.Outcome == request.OutcomeDone || t.Outcome == request.OutcomeTruncated {
		answer, err := a.streamedAnswer(ctx, in.RequestID)
		if err != nil {
			return err
		}
		t.Answer = answer
	}
	return a.Sessions.Append(ctx, in.Turn.Session.Tenant, in.Turn.Session.ID, t)
}

// streamedAnswer is the text of a request's token events.
func (a *Chat) streamedAnswer(ctx context.Context, requestID string) (string, error) {
	var b strings.Builder
	after := "0"
	for {
		evs, err := a.Events.After(ctx, requestID, after, 1000)
		if err != nil {
			return "", fmt.Errorf("read answer of %s: %w", requestID, err)
		}
		for _, ev := range evs {
			if ev.Type != events.TypeToken {
				continue
			}
			var tok events.Token
			if err := json.Unmarshal(ev.Data, &tok); err != nil {
				return "", fmt.Errorf("decode token of %s: %w", requestID, err)
			}
			b.WriteString(tok.Text)
		}
		if len(evs) < 1000 {
			return b.String(), nil
		}
		after = evs[len(evs)-1].ID
	}
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
	bound := a.promptBound(in.Query)
	// Requests with a session never get here: no history to count.
	pool := request.Route(bound, 0, a.Options.ShortThreshold)
	ans, hit, err := a.Answers.Get(ctx, a.answerKey(in.Query, in.KB, version, pool), in.MaxTokens)
	if err != nil || !hit {
		return LookupAnswerOutput{PromptBound: bound, KBVersion: version, Ms: time.Since(start).Milliseconds()}, err
	}
	out := LookupAnswerOutput{
		Hit: true, PromptBound: bound, KBVersion: version, FinishReason: ans.FinishReason,
		Sources: ans.Sources, ContextShed: ans.ContextShed,
	}
	if activity.GetInfo(ctx).Attempt > 1 {
		// An earlier attempt may have written the answer and lost only
		// its reply: never stream it twice.
		last, ok, err := a.Events.Last(ctx, in.RequestID)
		if err != nil {
			return LookupAnswerOutput{}, err
		}
		if ok && last.Type == events.TypeDone {
			out.Ms = time.Since(start).Milliseconds()
			return out, nil
		}
	}
	out.Ms = time.Since(start).Milliseconds()
	done := events.Done{RequestID: in.RequestID}
	if in.Done != nil {
		done = *in.Done
	}
	done.Route, done.KBVersion, done.Cached = request.RouteCache, version, true
	done.FinishReason, done.Sources, done.ContextShed = ans.FinishReason, ans.Sources, ans.ContextShed
	// The answer cost no LLM tokens this time; its usage says so.
	done.Usage = events.Usage{}
	done.Timings = append(append([]events.StageTiming(nil), done.Timings...),
		events.StageTiming{Stage: request.StageAnswerCache, Ms: out.Ms, Cache: "hit"})
	evs := make([]events.Pending, 0, len(ans.Tokens)+1)
	for i, text := range ans.Tokens {
		evs = append(evs, events.Pending{Type: events.TypeToken, Data: events.Token{Text: text, Index: i}})
	}
	evs = append(evs, events.Pending{Type: events.TypeDone, Data: done})
	if _, err := a.Events.AppendBatch(ctx, in.RequestID, evs); err != nil {
		return LookupAnswerOutput{}, err
	}
	return out, nil
}

// report records a finished request in the metrics and, for requests that
// reached a pool, in the shared latency window: each stage's time under
// "<stage>/<pool>", the time to the first token under "ttft/<pool>", and
// the counters "requests/<pool>" and "queue_timeouts/<pool>" the healer's
// timeout rate is made of.
func (a *Chat) report(r Report) {
	a.Metrics.ObserveRequest(metrics.Request{Route: r.Route, Outcome: metrics.OutcomeOf(r.Outcome, r.Reason), Timings: r.Timings})
	if a.Latency == nil || !request.IsPool(r.Route) {
		return
	}
	var ttft int64
	firstToken := false
	for _, t := range r.Timings {
		a.Latency.Record(latency.Series(t.Stage, r.Route), time.Duration(t.Ms)*time.Millisecond)
		switch t.Stage {
		case request.StageLLM: // the whole answer: past the first token
		case request.StageLLMFirstToken:
			firstToken = true
			ttft += t.Ms
		default:
			ttft += t.Ms
		}
	}
	if firstToken {
		// The client's wait for its first token, stage by stage: unlike
		// llm_first_token it counts the admission queue, so a healer
		// watching it sees waits that shrinking a pool moves there.
		a.Latency.Record(latency.Series(request.SeriesTTFT, r.Route), time.Duration(ttft)*time.Millisecond)
	}
	a.Latency.Add(latency.Series(request.SeriesRequests, r.Route), 1)
	if r.Reason == request.ReasonQueueTimeout {
		a.Latency.Add(latency.Series(request.SeriesQueueTimeouts, r.Route), 1)
	}
}
