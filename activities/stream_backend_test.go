package activities_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
)

// simulator serves an in-process llmsim a hundred times faster than real
// time, its config changed by edit (if not nil), until the test ends.
func simulator(t *testing.T, edit func(*llmsim.Config)) (*llmsim.Server, *httptest.Server) {
	t.Helper()
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale = 0.01
	if edit != nil {
		edit(&cfg)
	}
	sim, err := llmsim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(func() {
		srv.Close()
		sim.Close()
	})
	return sim, srv
}

// faultySimulator serves a simulator with fault and returns it with a
// client of it that has short deadlines and a breaker that opens after
// one failure.
func faultySimulator(t *testing.T, fault llmsim.Fault) (*llmsim.Server, *llm.OpenAI) {
	t.Helper()
	sim, srv := simulator(t, func(cfg *llmsim.Config) { cfg.Fault = fault })
	client, err := llm.NewOpenAI(llm.OpenAIOptions{
		Name: request.PoolShort, Endpoints: []string{srv.URL},
		Deadlines: llm.Deadlines{FirstToken: 300 * time.Millisecond, TokenIdle: 200 * time.Millisecond},
		Breaker:   llm.Breaker{Failures: 1, OpenFor: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	return sim, client
}

// A backend that fails before the first token is retried (the next
// endpoint may be healthy); once every circuit of the pool is open the
// request is refused at once, with when to come back, and never retried.
func TestStreamLLMPoolUnavailable(t *testing.T) {
	_, client := faultySimulator(t, llmsim.Fault{ErrorStatus: 503})
	h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	in := activities.LLMInput{RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits}
	_, err := stream(t, h, in, nil)
	wantAppError(t, err, activities.ErrTypeBackend, false)

	_, err = stream(t, h, in, nil)
	wantAppError(t, err, activities.ErrTypeBackendUnavailable, true)
	var d activities.BackendUnavailable
	if err := appError(t, err).Details(&d); err != nil {
		t.Fatalf("details: %v", err)
	}
	if d.RetryAfter <= 50*time.Second || d.RetryAfter > time.Minute {
		t.Fatalf("retry after %s, want just under the minute the circuit stays open", d.RetryAfter)
	}
	if !strings.Contains(err.Error(), "circuit open") {
		t.Errorf("error %q should say why", err)
	}
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n != 0 {
		t.Fatalf("%d tokens streamed", n)
	}
}

// The deadlines end a stuck stream long before the LLM timeout: before
// the first token it is a retryable backend error, after it an
// interruption that says what was consumed.
func TestStreamLLMDeadlines(t *testing.T) {
	for _, tc := range []struct {
		name         string
		fault        llmsim.Fault
		typ          string
		nonRetryable bool
		tokens       int
	}{
		{"stalled before the first token", llmsim.Fault{StallFirstToken: true}, activities.ErrTypeBackend, false, 0},
		{"stalled mid-answer", llmsim.Fault{StallAfterTokens: 4}, activities.ErrTypeStreamInterrupted, true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim, client := faultySimulator(t, tc.fault)
			h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
			version, hits := h.retrieveContext(t, "r1", 10, 3)
			began := time.Now()
			_, err := stream(t, h, activities.LLMInput{
				RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits, MaxTokens: 20,
			}, nil)
			wantAppError(t, err, tc.typ, tc.nonRetryable)
			if took := time.Since(began); took > 5*time.Second {
				t.Errorf("a stuck stream took %s to end", took)
			}
			if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n != tc.tokens {
				t.Fatalf("%d tokens streamed, want %d", n, tc.tokens)
			}
			if tc.tokens > 0 {
				var u events.Usage
				if err := appError(t, err).Details(&u); err != nil || u.CompletionTokens != tc.tokens {
					t.Fatalf("consumed %+v, %v: want %d completion tokens", u, err, tc.tokens)
				}
			}
			// The simulator frees the stuck request's slot once the
			// client has given up.
			deadline := time.Now().Add(5 * time.Second)
			for sim.Stats().Running != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the stuck request still holds its slot")
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// An answer whose endpoint drops its connection mid-stream is continued
// by the pool's other endpoint: the client's tokens run on with the next
// indexes to the end, the output records the failover, and the usage
// bills each token the client got once.
func TestStreamLLMFailsOverMidAnswer(t *testing.T) {
	same := func(cfg *llmsim.Config) { cfg.Seed = 7 }
	_, dying := simulator(t, func(cfg *llmsim.Config) { same(cfg); cfg.Fault = llmsim.Fault{DieAfterTokens: 6} })
	_, healthy := simulator(t, same)
	client, err := llm.NewOpenAI(llm.OpenAIOptions{
		Name: request.PoolShort, Endpoints: []string{dying.URL, healthy.URL}, Continuation: llm.ContinuationVLLM,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits, MaxTokens: 30,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks := ofType(h.events(t, "r1"), events.TypeToken)
	answered := 0
	for i, ev := range toks {
		var tok events.Token
		if err := json.Unmarshal(ev.Data, &tok); err != nil || tok.Index != i {
			t.Fatalf("token %d has index %d (%v)", i, tok.Index, err)
		}
		if !tok.Notice {
			answered++
		}
	}
	if len(out.Failovers) != 1 || out.Failovers[0].AfterTokens != 6 || out.Failovers[0].Outcome != llm.FailoverResumed {
		t.Fatalf("failovers %+v, want one resumed after 6 tokens", out.Failovers)
	}
	if out.Usage.CompletionTokens != answered || answered != 30 || out.Usage.Reported || out.Usage.PromptTokens == 0 {
		t.Fatalf("usage %+v for %d tokens of the answer streamed (max_tokens 30)", out.Usage, answered)
	}
}

// A retry whose earlier attempt was lost mid-answer continues the answer
// on a pool whose backend can: the client's tokens run on from where the
// lost attempt left them, without a second llm stage event, to exactly
// the answer an unbroken stream gives, billed once.
func TestStreamLLMRetryResumesTheLostAttempt(t *testing.T) {
	_, srv := simulator(t, nil)
	client, err := llm.NewOpenAI(llm.OpenAIOptions{Name: request.PoolShort, Endpoints: []string{srv.URL}, Continuation: llm.ContinuationVLLM})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
	pool := h.acts.Pools[request.PoolShort]
	pool.Continues = true
	h.acts.Pools[request.PoolShort] = pool
	texts := func(id string) []string {
		var out []string
		for i, ev := range ofType(h.events(t, id), events.TypeToken) {
			var tok events.Token
			if err := json.Unmarshal(ev.Data, &tok); err != nil || tok.Index != i {
				t.Fatalf("%s: token %d has index %d (%v)", id, i, tok.Index, err)
			}
			out = append(out, tok.Text)
		}
		return out
	}
	input := func(id string) activities.LLMInput {
		version, hits := h.retrieveContext(t, id, 10, 3)
		return activities.LLMInput{RequestID: id, Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits, MaxTokens: 40}
	}
	whole, err := stream(t, h, input("r0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := texts("r0")
	if _, err := h.gate.Release(t.Context(), request.PoolShort, "r0"); err != nil {
		t.Fatal(err)
	}
	in := input("r1")
	stagesBefore := len(ofType(h.events(t, "r1"), events.TypeStage))
	// The lost attempt wrote its stage event and 7 tokens, the 7th twice
	// (a retried write), before its worker died.
	if _, err := h.log.Append(context.Background(), "r1", events.TypeStage, events.Stage{Stage: request.StageLLM, Pool: request.PoolShort}); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		if _, err := h.log.Append(context.Background(), "r1", events.TypeToken, events.Token{Text: want[min(i, 6)], Index: min(i, 6)}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := stream(t, h, in, struct{ Tokens int }{Tokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range ofType(h.events(t, "r1"), events.TypeToken) {
		var tok events.Token
		_ = json.Unmarshal(ev.Data, &tok)
		if len(got) == tok.Index {
			got = append(got, tok.Text)
		}
	}
	if strings.Join(got, "") != strings.Join(want, "") {
		t.Fatalf("resumed answer %q\nwant %q", strings.Join(got, ""), strings.Join(want, ""))
	}
	if n := len(ofType(h.events(t, "r1"), events.TypeStage)) - stagesBefore; n != 1 {
		t.Errorf("%d llm stage events, want the lost attempt's one", n)
	}
	if out.Usage.CompletionTokens != whole.Usage.CompletionTokens || out.Usage.PromptTokens != whole.Usage.PromptTokens || out.FinishReason != whole.FinishReason {
		t.Errorf("resumed usage %+v finish %s, unbroken %+v finish %s", out.Usage, out.FinishReason, whole.Usage, whole.FinishReason)
	}
}
