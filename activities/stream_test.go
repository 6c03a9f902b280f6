package activities_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

func TestStreamLLMWritesTokensInOrder(t *testing.T) {
	toks := []string{"Admission", " control", " queues", " requests", "."}
	for _, tc := range []struct {
		name  string
		usage *llm.Usage
	}{
		{"usage reported", &llm.Usage{PromptTokens: 321, CompletionTokens: 5, TotalTokens: 326}},
		{"usage counted", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeLLM{tokens: toks, usage: tc.usage}
			h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
			version, hits := h.retrieveContext(t, "r1", 10, 3)
			out, err := stream(t, h, activities.LLMInput{
				RequestID: "r1", Pool: request.PoolShort, Query: query,
				KB: kbName, KBVersion: version, Context: hits, MaxTokens: 64,
			}, nil)
			if err != nil {
				t.Fatal(err)
			}

			evs := h.events(t, "r1")
			var llmStage int
			for i, ev := range evs {
				if ev.Type == events.TypeStage && decode[events.Stage](t, ev).Stage == "llm" {
					llmStage = i
				}
			}
			got := ofType(evs, events.TypeToken)
			if len(got) != len(toks) || evs[llmStage+1].Type != events.TypeToken {
				t.Fatalf("events %+v: want the llm stage, then %d tokens", evs, len(toks))
			}
			if st := decode[events.Stage](t, evs[llmStage]); st.Pool != request.PoolShort {
				t.Fatalf("llm stage event %+v, want pool short", st)
			}
			for i, ev := range got {
				if tok := decode[events.Token](t, ev); tok.Index != i || tok.Text != toks[i] {
					t.Fatalf("token event %d: %+v, want %q at %d", i, tok, toks[i], i)
				}
			}

			reqs := fake.requests()
			if len(reqs) != 1 || reqs[0].MaxTokens != 64 || reqs[0].Model != "fake" {
				t.Fatalf("llm requests %+v", reqs)
			}
			want := events.Usage{PromptTokens: h.acts.Prompts.Count(reqs[0].Messages), CompletionTokens: len(toks)}
			if tc.usage != nil {
				want = events.Usage{PromptTokens: tc.usage.PromptTokens, CompletionTokens: tc.usage.CompletionTokens, Reported: true}
			}
			want.TotalTokens = want.PromptTokens + want.CompletionTokens
			if out.Usage != want {
				t.Fatalf("usage %+v, want %+v", out.Usage, want)
			}
			if out.FinishReason != "stop" || out.ContextShed != 0 || len(out.Sources) == 0 {
				t.Fatalf("output %+v, want finished with sources and nothing shed", out)
			}
		})
	}
}

func TestStreamLLMStopsOnStopFlag(t *testing.T) {
	const stopAt = 2
	var h *harness
	fake := &fakeLLM{tokens: words(200), delay: time.Millisecond}
	fake.onToken = func(i int) bool {
		if i == stopAt {
			if _, err := local[struct{}](t, h, h.acts.StopStream, activities.StopStreamInput{RequestID: "r1"}); err != nil {
				t.Error(err)
			}
		}
		return false
	}
	h = newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	wantAppError(t, err, activities.ErrTypeCancelled, true)
	// The token written with the flag read is the last.
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n <= stopAt || n > stopAt+2 {
		t.Fatalf("%d tokens streamed, want the stream to stop right after token %d", n, stopAt)
	}
}

// A retry whose earlier attempt streamed tokens and was lost ends the
// answer as interrupted, billed for those tokens, whatever that attempt's
// heartbeat said: the event stream is what the client has, and heartbeats
// trail it by seconds.
func TestStreamLLMInterruptedAttemptIsNotRetried(t *testing.T) {
	for _, heartbeat := range []int{0, 2, 5} {
		t.Run(fmt.Sprintf("heartbeat said %d tokens", heartbeat), func(t *testing.T) {
			fake := &fakeLLM{tokens: words(3)}
			h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
			id := fmt.Sprintf("r%d", heartbeat)
			version, hits := h.retrieveContext(t, id, 10, 3)
			// The lost attempt wrote 5 tokens before its worker died.
			for i := range 5 {
				if _, err := h.log.Append(context.Background(), id, events.TypeToken, events.Token{Text: "w ", Index: i}); err != nil {
					t.Fatal(err)
				}
			}
			evsBefore := len(h.events(t, id))
			_, err := stream(t, h, activities.LLMInput{
				RequestID: id, Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
			}, struct{ Tokens int }{Tokens: heartbeat})
			wantAppError(t, err, activities.ErrTypeStreamInterrupted, true)
			var used events.Usage
			if err := appError(t, err).Details(&used); err != nil {
				t.Fatalf("interrupted error without usage: %v", err)
			}
			if used.CompletionTokens != 5 || used.PromptTokens <= 0 || used.TotalTokens != used.PromptTokens+5 {
				t.Fatalf("usage %+v, want the 5 streamed tokens and the prompt", used)
			}
			if n := len(fake.requests()); n != 0 {
				t.Fatalf("the llm was called %d times, want never", n)
			}
			if n := len(h.events(t, id)); n != evsBefore {
				t.Fatalf("the new attempt wrote %d events", n-evsBefore)
			}
		})
	}
}

func TestStreamLLMFreshAttemptWithZeroProgressRuns(t *testing.T) {
	fake := &fakeLLM{tokens: words(2)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	// A previous attempt that heartbeated before its first token.
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, struct{ Tokens int }{Tokens: 0}); err != nil {
		t.Fatal(err)
	}
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n != 2 {
		t.Fatalf("%d tokens, want 2", n)
	}
}

func TestStreamLLMBackendErrors(t *testing.T) {
	for _, tc := range []struct {
		name         string
		fake         *fakeLLM
		typ          string
		nonRetryable bool
		tokens       int
	}{
		{
			name: "retryable before the first token",
			fake: &fakeLLM{tokens: words(5), err: &llm.Error{Endpoint: "fake", Status: 503, Message: "overloaded", Retryable: true}},
			typ:  activities.ErrTypeBackend,
		},
		{
			name: "pool unavailable",
			fake: &fakeLLM{tokens: words(5), err: &llm.UnavailableError{Pool: request.PoolShort, Endpoints: 2, RetryAfter: 7 * time.Second}},
			typ:  activities.ErrTypeBackendUnavailable, nonRetryable: true,
		},
		{
			name: "rejected before the first token",
			fake: &fakeLLM{tokens: words(5), err: &llm.Error{Endpoint: "http://10.1.2.3:8000/v1", Status: 400, Message: "secret backend detail"}},
			typ:  activities.ErrTypeBadRequest, nonRetryable: true,
		},
		{
			name: "retryable after tokens",
			fake: &fakeLLM{tokens: words(5), failAfter: 3, err: &llm.Error{Endpoint: "fake", Message: "stream broken", Retryable: true}},
			typ:  activities.ErrTypeStreamInterrupted, nonRetryable: true, tokens: 3,
		},
		{
			name: "after the last token",
			fake: &fakeLLM{tokens: words(2), failAfter: 2, err: &llm.Error{Endpoint: "fake", Message: "no finish_reason", Retryable: true}},
			typ:  activities.ErrTypeStreamInterrupted, nonRetryable: true, tokens: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOptions) { o.streamer = tc.fake })
			version, hits := h.retrieveContext(t, "r1", 10, 3)
			_, err := stream(t, h, activities.LLMInput{
				RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
			}, nil)
			wantAppError(t, err, tc.typ, tc.nonRetryable)
			// Clients may see an application error's message; its
			// backend's address and body are the operators'.
			if msg := appError(t, err).Message(); strings.Contains(msg, "10.1.2.3") || strings.Contains(msg, "secret") {
				t.Fatalf("message %q shows the backend's address or body", msg)
			}
			if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n != tc.tokens {
				t.Fatalf("%d tokens streamed, want %d", n, tc.tokens)
			}
		})
	}
}

func TestStreamLLMShedsContextToFitPool(t *testing.T) {
	const keep = 2
	fake := &fakeLLM{tokens: words(3)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 6)
	if len(hits) != 6 {
		t.Fatalf("%d hits, want 6", len(hits))
	}
	ids := make([]string, len(hits))
	for i, hit := range hits {
		ids[i] = hit.ID
	}
	chunks, err := h.kb.Lookup(context.Background(), kbName, version, ids)
	if err != nil {
		t.Fatal(err)
	}
	fits := h.acts.Prompts.Count(h.acts.Prompts.Messages(chunks[:keep], query))
	if next := h.acts.Prompts.Count(h.acts.Prompts.Messages(chunks[:keep+1], query)); next <= fits {
		t.Fatalf("prompt with %d chunks (%d tokens) is not longer than with %d (%d)", keep+1, next, keep, fits)
	}
	h.acts.Pools[request.PoolShort] = activities.Pool{Streamer: fake, Model: "fake", MaxPromptTokens: fits}

	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.ContextShed != len(hits)-keep {
		t.Fatalf("shed %d chunks, want %d", out.ContextShed, len(hits)-keep)
	}
	reqs := fake.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d llm requests, want 1", len(reqs))
	}
	sys := textOf(reqs[0].Messages[0])
	if !strings.Contains(sys, fmt.Sprintf("[%d] ", keep)) || strings.Contains(sys, fmt.Sprintf("[%d] ", keep+1)) {
		t.Fatalf("system prompt does not hold exactly the best %d chunks:\n%s", keep, sys)
	}
	if n := h.acts.Prompts.Count(reqs[0].Messages); n > fits || out.Usage.PromptTokens != n {
		t.Fatalf("prompt sent has %d tokens (usage says %d), pool allows %d", n, out.Usage.PromptTokens, fits)
	}
	var wantSources []string
	for _, c := range chunks[:keep] {
		if !slices.Contains(wantSources, c.DocID) {
			wantSources = append(wantSources, c.DocID)
		}
	}
	if !slices.Equal(out.Sources, wantSources) {
		t.Fatalf("sources %v, want those of the kept chunks %v", out.Sources, wantSources)
	}
}

func TestStreamLLMRenewsPermitLease(t *testing.T) {
	// keepAlive renews at most once a second (its tick), so the stream
	// runs until the lease was seen to grow, for at most 2.5 s.
	var h *harness
	var first float64
	var grew atomic.Bool
	fake := &fakeLLM{tokens: words(100), delay: 25 * time.Millisecond}
	fake.onToken = func(i int) bool {
		// Not t.Fatal: this runs inside the activity.
		exp, err := h.rdb.ZScore(context.Background(), h.prefix+"adm:{short}:permits", "r1").Result()
		if err != nil {
			t.Errorf("read the permit's lease: %v (redis.Nil: the permit was lost)", err)
			return true
		}
		if i == 0 {
			first = exp
		}
		if exp-first >= 500 {
			grew.Store(true)
			return true
		}
		return false
	}
	h = newHarness(t, func(o *harnessOptions) {
		o.streamer = fake
		// A lease over two ticks, so that the test does not depend on
		// which tick renews first.
		o.lease = 2500 * time.Millisecond
	})
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil); err != nil {
		t.Fatal(err)
	}
	if !grew.Load() {
		t.Fatal("the permit's lease was not renewed during a 2.5 s stream")
	}
}

func TestStreamLLMKeepsPermitWithSubSecondLease(t *testing.T) {
	var h *harness
	fake := &fakeLLM{tokens: words(30), delay: 25 * time.Millisecond} // 750 ms
	h = newHarness(t, func(o *harnessOptions) {
		o.streamer = fake
		o.lease = 300 * time.Millisecond
	})
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil); err != nil {
		t.Fatal(err)
	}
	held, err := h.gate.Renew(context.Background(), request.PoolShort, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if !held {
		t.Fatal("permit lost during a 750 ms stream with a 300 ms lease")
	}
}

// Context whose text is gone (its document changed after retrieval and
// the old revision's grace period ran out) is not streamed from.
func TestStreamLLMStaleKBIsNotRetried(t *testing.T) {
	fake := &fakeLLM{tokens: words(2)}
	kb := retiringKnowledge(t)
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake; o.kb = kb })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	kb.rewrite(t, version, hits[0].ID)
	_, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	if len(fake.requests()) != 0 {
		t.Fatal("the llm was called with context whose text is gone")
	}
	appErr := appError(t, err)
	if appErr.Type() != activities.ErrTypeBadRequest || !appErr.NonRetryable() {
		t.Fatalf("stale kb must fail non-retryably as BadRequest, got %q: %v", appErr.Type(), err)
	}
}

func TestStreamLLMAgainstSimulator(t *testing.T) {
	_, srv := simulator(t, nil)
	client, err := llm.NewOpenAI(llm.OpenAIOptions{Endpoints: []string{srv.URL}, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	const maxTokens = 8
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits, MaxTokens: maxTokens,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The answer's tokens, then the notice that it was cut, marked as
	// Sluice's (the OpenAI routes leave it out).
	toks := ofType(h.events(t, "r1"), events.TypeToken)
	if len(toks) != maxTokens+1 || decode[events.Token](t, toks[maxTokens]).Text != h.acts.Options.TruncationNotice ||
		!decode[events.Token](t, toks[maxTokens]).Notice {
		t.Fatalf("%d token events, want %d and the truncation notice", len(toks), maxTokens)
	}
	for i, ev := range toks {
		if tok := decode[events.Token](t, ev); tok.Index != i || tok.Text == "" || (tok.Notice != (i == maxTokens)) {
			t.Fatalf("token event %d: %+v", i, tok)
		}
	}
	if out.FinishReason != "length" || !out.Usage.Reported || out.Usage.CompletionTokens != maxTokens ||
		out.Usage.PromptTokens <= 0 || out.Usage.TotalTokens != out.Usage.PromptTokens+maxTokens {
		t.Fatalf("output %+v, want %d tokens cut by length with reported usage", out, maxTokens)
	}
	// The simulator counts the prompt with the same tokenizer and chat
	// framing the builder uses.
	chunks, err := h.kb.Lookup(context.Background(), kbName, version, []string{hits[0].ID, hits[1].ID, hits[2].ID})
	if err != nil {
		t.Fatal(err)
	}
	if want := h.acts.Prompts.Count(h.acts.Prompts.Messages(chunks, query)); out.Usage.PromptTokens != want {
		t.Fatalf("reported prompt tokens %d, builder counts %d", out.Usage.PromptTokens, want)
	}
}

func TestStreamLLMSimulatorRejectsPrompt(t *testing.T) {
	_, srv := simulator(t, func(cfg *llmsim.Config) {
		cfg.KVCacheBlocks, cfg.BlockSize = 2, 16 // a 32-token context
	})
	client, err := llm.NewOpenAI(llm.OpenAIOptions{Endpoints: []string{srv.URL}, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err = stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	wantAppError(t, err, activities.ErrTypeBadRequest, true)
	if !strings.Contains(err.Error(), "400") {
		t.Fatalf("error %v does not carry the backend's 400", err)
	}
}

// The stream writes the done event itself as soon as the answer is
// complete, from what the workflow knew plus what it measured.
func TestStreamLLMWritesDone(t *testing.T) {
	fake := &fakeLLM{tokens: words(4)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
		Done: &activities.DoneFacts{RequestID: "r1", Route: "short", KBVersion: version, Timings: []events.StageTiming{{Stage: "embed", Ms: 1}}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !out.DoneWritten {
		t.Fatal("DoneWritten not reported")
	}
	evs := h.events(t, "r1")
	last := evs[len(evs)-1]
	if last.Type != events.TypeDone {
		t.Fatalf("last event %s, want done", last.Type)
	}
	done := decode[events.Done](t, last)
	if done.Route != "short" || done.KBVersion != version || done.Usage.CompletionTokens != 4 || len(done.Sources) == 0 {
		t.Fatalf("done %+v", done)
	}
	var stages []string
	for _, st := range done.Timings {
		stages = append(stages, st.Stage)
	}
	if strings.Join(stages, ",") != "embed,llm_first_token,llm" {
		t.Fatalf("done timings %v", stages)
	}
}

// A retried attempt whose predecessor finished and wrote done (then was
// lost before reporting) reports that answer instead of failing it.
func TestStreamLLMRetryAfterDoneReportsIt(t *testing.T) {
	fake := &fakeLLM{tokens: words(3)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	in := activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
		Done: &activities.DoneFacts{RequestID: "r1", Route: "short", KBVersion: version},
	}
	first, err := stream(t, h, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	evsBefore := len(h.events(t, "r1"))
	// The first attempt gave its permit back with its done event.
	again, err := streamAsIs(t, h, in, struct{ Tokens int }{Tokens: 3})
	if err != nil {
		t.Fatalf("retry after a written done: %v", err)
	}
	if !again.DoneWritten || again.Usage != first.Usage || again.FinishReason != first.FinishReason {
		t.Fatalf("retry reported %+v, first was %+v", again, first)
	}
	if n := len(fake.requests()); n != 1 {
		t.Fatalf("the llm was called %d times, want once", n)
	}
	if n := len(h.events(t, "r1")); n != evsBefore {
		t.Fatalf("the retry wrote %d events", n-evsBefore)
	}
}

// A request whose permit was reclaimed before its stream started does not
// call the LLM: it is told to queue again.
func TestStreamLLMWithoutPermitQueuesAgain(t *testing.T) {
	fake := &fakeLLM{tokens: words(4)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err := streamAsIs(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	wantAppError(t, err, activities.ErrTypePermitLost, true)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.reqs) != 0 {
		t.Fatalf("the LLM was called %d times without a permit", len(fake.reqs))
	}
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n != 0 {
		t.Fatalf("%d tokens written by a stream that never started", n)
	}
}

func TestTruncatedAnswerEndsWithNoticeAndIsNotCached(t *testing.T) {
	fake := &fakeLLM{tokens: []string{"It", " depe"}, finish: "length"}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	ref := &activities.SessionRef{Tenant: "acme", User: "alice", ID: "s"}
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version,
		Context: hits, MaxTokens: 2, Session: ref, CacheAnswer: true,
		Done: &activities.DoneFacts{RequestID: "r1", Route: request.PoolShort},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	notice := config.Default().LLM.TruncationNotice
	toks := ofType(h.events(t, "r1"), events.TypeToken)
	if len(toks) != 3 || decode[events.Token](t, toks[2]).Text != notice || decode[events.Token](t, toks[2]).Index != 2 {
		t.Fatalf("token events %+v, want the answer then the notice", toks)
	}
	if out.Usage.CompletionTokens != 2 || out.FinishReason != "length" {
		t.Fatalf("the notice counted as model output: %+v", out)
	}
	if turns := h.turns(t, alice, "s"); len(turns) != 1 || turns[0].Outcome != request.OutcomeTruncated || turns[0].Answer != "It depe"+notice {
		t.Fatalf("turns %+v", turns)
	}
	if got := h.lookup(t, "r2", 100); got.Hit {
		t.Fatal("a truncated answer was served from the answer cache")
	}
}

// A stream that wrote its done event gives its permit back at once, and
// the next waiter is granted it, without waiting for Finalize.
func TestStreamLLMGivesThePermitBackWithDone(t *testing.T) {
	fake := &fakeLLM{tokens: words(3)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	in := activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
		Done: &activities.DoneFacts{RequestID: "r1", Route: "short", KBVersion: version},
	}
	if r := h.enqueue(t, in.Pool, in.RequestID); r.Status != admission.Granted {
		t.Fatalf("r1: %+v", r)
	}
	if r := h.enqueue(t, in.Pool, "r2"); r.Status != admission.Queued {
		t.Fatalf("r2 should wait for r1's permit: %+v", r)
	}
	if _, err := streamAsIs(t, h, in, nil); err != nil {
		t.Fatal(err)
	}
	if r := h.enqueue(t, in.Pool, "r2"); r.Status != admission.Granted {
		t.Fatalf("after r1's done, r2 %+v; want the permit r1 gave back", r)
	}
}

// Redis pausing writes for longer than a call's timeout mid-answer delays
// the answer; it does not cut it off. A retried write may land twice;
// readers drop the repeat by its index.
func TestStreamLLMRidesThroughARedisStall(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses the shared redis-server for 4 s")
	}
	admin := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer admin.Close()
	var h *harness
	fake := &fakeLLM{tokens: words(5)}
	fake.onToken = func(i int) bool {
		if i == 2 {
			// Longer than go-redis' 3 s read timeout: the write fails once.
			if err := admin.Do(context.Background(), "CLIENT", "PAUSE", "4000", "WRITE").Err(); err != nil {
				t.Error(err)
			}
		}
		return false
	}
	h = newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	if err != nil {
		t.Fatalf("a 4 s write pause ended the stream: %v", err)
	}
	if out.Usage.CompletionTokens != 5 {
		t.Fatalf("usage %+v, want 5 completion tokens", out.Usage)
	}
	seen := map[int]bool{}
	for _, ev := range ofType(h.events(t, "r1"), events.TypeToken) {
		var tok events.Token
		if err := json.Unmarshal(ev.Data, &tok); err != nil {
			t.Fatal(err)
		}
		seen[tok.Index] = true
	}
	if len(seen) != 5 {
		t.Fatalf("token indexes %v, want 0..4", seen)
	}
}

// A gateway stream sends the client's conversation and parameters as they
// came, and writes the backend's tool-call pieces and model name into
// the request's events.
func TestGatewayStreamForwardsAndRecordsToolCalls(t *testing.T) {
	fake := &fakeLLM{finish: "tool_calls", deltas: []llm.Delta{
		{Model: "m-2024", ToolCalls: []openai.ToolCallDelta{{Index: 0, ID: "call_1", Type: "function", Function: openai.FunctionCallDelta{Name: "calc"}}}},
		{ToolCalls: []openai.ToolCallDelta{{Index: 0, Function: openai.FunctionCallDelta{Arguments: `{"x":1}`}}}},
	}}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	conv := []openai.Message{openai.TextMessage("system", "be brief"), openai.TextMessage("user", "add one")}
	temp := 0.0
	sampling := &openai.Sampling{Temperature: &temp, Tools: []openai.Tool{{Type: "function", Function: openai.FunctionDef{Name: "calc"}}}}
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "g1", Pool: request.PoolShort, MaxTokens: 16, Gateway: true, Conversation: conv, Sampling: sampling,
		Done: &activities.DoneFacts{RequestID: "g1"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reqs := fake.requests()
	if len(reqs) != 1 || len(reqs[0].Messages) != 2 || textOf(reqs[0].Messages[0]) != "be brief" || reqs[0].Sampling.Temperature == nil || len(reqs[0].Sampling.Tools) != 1 {
		t.Fatalf("backend got %+v", reqs)
	}
	if out.Model != "m-2024" || out.FinishReason != "tool_calls" || out.ContextShed != 0 || len(out.Sources) != 0 {
		t.Fatalf("output %+v", out)
	}
	var calls []openai.ToolCall
	index := map[int]int{}
	var done events.Done
	for _, ev := range h.events(t, "g1") {
		switch ev.Type {
		case events.TypeToken:
			var tok events.Token
			if err := json.Unmarshal(ev.Data, &tok); err != nil {
				t.Fatal(err)
			}
			if (tok.Index == 0) != (tok.Model == "m-2024") {
				t.Fatalf("token %d names model %q", tok.Index, tok.Model)
			}
			calls = openai.AddToolCalls(calls, index, tok.ToolCalls)
		case events.TypeDone:
			if err := json.Unmarshal(ev.Data, &done); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(calls) != 1 || calls[0].ID != "call_1" || calls[0].Function.Name != "calc" || calls[0].Function.Arguments != `{"x":1}` {
		t.Fatalf("tool calls in the events: %+v", calls)
	}
	if done.Model != "m-2024" || done.FinishReason != "tool_calls" {
		t.Fatalf("done %+v", done)
	}
}
