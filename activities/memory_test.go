package activities_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/latency"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
)

func (h *harness) turns(t *testing.T, tenant, id string) []session.Turn {
	t.Helper()
	turns, err := h.acts.Sessions.Turns(context.Background(), tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	return turns
}

// history returns the earlier turns a prompt carried: the messages
// between the system message and the query.
func history(msgs []llm.Message) []llm.Message { return msgs[1 : len(msgs)-1] }

func TestSecondTurnCarriesTheFirst(t *testing.T) {
	fake := &fakeLLM{tokens: []string{"Buckets", " refill", " steadily."}}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	ref := &activities.SessionRef{Tenant: "acme", ID: "s1", HistoryTokens: 1024}
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: "How do buckets refill?", KB: kbName,
		KBVersion: version, Context: hits, MaxTokens: 64, Session: ref,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !out.TurnRecorded {
		t.Fatal("the answer was not recorded in the session")
	}
	finalize(t, h, done("r1"))
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r2", Pool: request.PoolShort, Query: "And how fast?", KB: kbName,
		KBVersion: version, Context: hits, MaxTokens: 64, Session: ref,
	}, nil); err != nil {
		t.Fatal(err)
	}
	reqs := fake.requests()
	if got := history(reqs[0].Messages); len(got) != 0 {
		t.Fatalf("the first turn carried history %+v", got)
	}
	got := history(reqs[1].Messages)
	if len(got) != 2 || got[0].Role != "user" || got[0].Content != "How do buckets refill?" ||
		got[1].Role != "assistant" || got[1].Content != "Buckets refill steadily." {
		t.Fatalf("the second turn carried %+v", got)
	}
	if last := reqs[1].Messages[len(reqs[1].Messages)-1]; last.Content != "And how fast?" {
		t.Fatalf("the query is not last: %+v", last)
	}
	turns := h.turns(t, "acme", "s1")
	if len(turns) != 2 || turns[1].RequestID != "r2" || turns[1].Outcome != request.OutcomeDone {
		t.Fatalf("turns %+v", turns)
	}
	// Another tenant's session of the same name is another session.
	if other := h.turns(t, "globex", "s1"); len(other) != 0 {
		t.Fatalf("another tenant sees %+v", other)
	}
}

func TestHistoryKeepsTheNewestTurnsThatFitItsBudget(t *testing.T) {
	fake := &fakeLLM{tokens: []string{"ok"}}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	ctx := context.Background()
	for i := range 12 {
		turn := session.Turn{
			RequestID: fmt.Sprint("old-", i), Query: fmt.Sprintf("question number %d about queues?", i),
			Answer: strings.Repeat(fmt.Sprintf("answer %d ", i), 20), Outcome: request.OutcomeDone,
		}
		if err := h.acts.Sessions.Append(ctx, "acme", "s", turn); err != nil {
			t.Fatal(err)
		}
	}
	stored := session.Exchanges(h.turns(t, "acme", "s"))
	const budget = 200
	want, used := h.acts.Prompts.FitHistory(stored, budget)
	if len(want) == 0 || len(want) == len(stored) || used > budget {
		t.Fatalf("test needs a budget that keeps some turns: kept %d of %d in %d tokens", len(want), len(stored), used)
	}
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version,
		Context: hits, MaxTokens: 8, Session: &activities.SessionRef{Tenant: "acme", ID: "s", HistoryTokens: budget},
	}, nil); err != nil {
		t.Fatal(err)
	}
	got := history(fake.requests()[0].Messages)
	if len(got) != 2*len(want) {
		t.Fatalf("prompt carried %d messages of history, want %d", len(got), 2*len(want))
	}
	// The newest turn is the last before the query.
	if newest := stored[len(stored)-1]; got[len(got)-2].Content != newest.User {
		t.Fatalf("newest turn in the prompt is %q, want %q", got[len(got)-2].Content, newest.User)
	}
}

func TestAdmitRoutesWithSessionHistory(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	// A long earlier answer pushes a short question past the threshold.
	turn := session.Turn{RequestID: "old", Query: "Tell me everything.", Answer: strings.Repeat("token bucket ", 300), Outcome: request.OutcomeDone}
	if err := h.acts.Sessions.Append(ctx, "acme", "long", turn); err != nil {
		t.Fatal(err)
	}
	alone := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{RequestID: "r1", Query: "And then?", Tenant: "acme"})
	if alone.Pool != request.PoolShort || alone.HistoryTokens != 0 {
		t.Fatalf("without its session: %+v", alone)
	}
	with := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "r2", Query: "And then?", Tenant: "acme",
		Session: &activities.SessionRef{Tenant: "acme", ID: "long", HistoryTokens: 4096},
	})
	if with.Pool != request.PoolLong || with.HistoryTokens == 0 || with.EstimatedPromptTokens != alone.EstimatedPromptTokens+with.HistoryTokens {
		t.Fatalf("with its session: %+v (alone %+v)", with, alone)
	}
}

func TestFinalizeRecordsWhatBecameOfTheRequest(t *testing.T) {
	h := newHarness(t, nil)
	ref := activities.SessionRef{Tenant: "acme", ID: "s"}
	rejected := activities.FinalizeInput{
		RequestID: "r1", EventType: events.TypeRejected,
		Failure: &events.Failure{Reason: "queue_timeout", Message: "busy"},
		Turn:    &activities.TurnInput{Session: ref, Query: "first?", Outcome: request.OutcomeRejected, Reason: "queue_timeout"},
	}
	// Finalize is retried whole: the turn is recorded once.
	finalize(t, h, rejected)
	finalize(t, h, rejected)
	// A done request whose stream could not record its answer: Finalize
	// reads it back from the event stream.
	for i, text := range []string{"Yes", ", it", " is."} {
		if _, err := h.log.Append(context.Background(), "r2", events.TypeToken, events.Token{Text: text, Index: i}); err != nil {
			t.Fatal(err)
		}
	}
	finalize(t, h, activities.FinalizeInput{
		RequestID: "r2", Turn: &activities.TurnInput{Session: ref, Query: "second?", Outcome: request.OutcomeDone},
	})
	turns := h.turns(t, "acme", "s")
	if len(turns) != 2 || turns[0].Outcome != request.OutcomeRejected || turns[0].Reason != "queue_timeout" ||
		turns[1].Answer != "Yes, it is." {
		t.Fatalf("turns %+v", turns)
	}
	if e := turns[0].Exchange(); !strings.Contains(e.Assistant, "busy") {
		t.Fatalf("a rejected turn reads %q to the model", e.Assistant)
	}
}

func TestTruncatedAnswerEndsWithNoticeAndIsNotCached(t *testing.T) {
	fake := &fakeLLM{tokens: []string{"It", " depe"}, finish: "length"}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	ref := &activities.SessionRef{Tenant: "acme", ID: "s"}
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version,
		Context: hits, MaxTokens: 2, Session: ref, CacheAnswer: true,
		Done: &events.Done{RequestID: "r1", Route: request.PoolShort},
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
	if turns := h.turns(t, "acme", "s"); len(turns) != 1 || turns[0].Outcome != request.OutcomeTruncated || turns[0].Answer != "It depe"+notice {
		t.Fatalf("turns %+v", turns)
	}
	if got := h.lookup(t, "r2", 100); got.Hit {
		t.Fatal("a truncated answer was served from the answer cache")
	}
}

func (h *harness) lookup(t *testing.T, requestID string, maxTokens int) activities.LookupAnswerOutput {
	t.Helper()
	return mustLocal[activities.LookupAnswerOutput](t, h, h.acts.LookupAnswer, activities.LookupAnswerInput{
		RequestID: requestID, Query: query, KB: kbName, MaxTokens: maxTokens,
		Done: &events.Done{RequestID: requestID, Timings: []events.StageTiming{{Stage: "embed", Ms: 1}}},
	})
}

func TestAnswerCacheServesACompleteAnswer(t *testing.T) {
	toks := []string{"Admission", " queues", " requests."}
	fake := &fakeLLM{tokens: toks, usage: &llm.Usage{PromptTokens: 300, CompletionTokens: 3, TotalTokens: 303}}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	miss := h.lookup(t, "r0", 100)
	if miss.Hit {
		t.Fatal("hit in an empty cache")
	}
	// The pool the lookup keys by is the one admission routes to, and the
	// bound it counted is admission's.
	adm := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{RequestID: "r1", Query: query})
	if miss.PromptBound == 0 || miss.PromptBound != adm.EstimatedPromptTokens {
		t.Fatalf("lookup counted a bound of %d, admission %d", miss.PromptBound, adm.EstimatedPromptTokens)
	}
	pool := adm.Pool
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: pool, Query: query, KB: kbName, KBVersion: version,
		Context: hits, MaxTokens: 64, CacheAnswer: true,
	}, nil); err != nil {
		t.Fatal(err)
	}
	got := h.lookup(t, "r2", 64)
	if !got.Hit || got.KBVersion != version || got.FinishReason != "stop" || len(got.Sources) == 0 {
		t.Fatalf("lookup %+v", got)
	}
	evs := h.events(t, "r2")
	var text []string
	for _, ev := range ofType(evs, events.TypeToken) {
		text = append(text, decode[events.Token](t, ev).Text)
	}
	if strings.Join(text, "") != strings.Join(toks, "") {
		t.Fatalf("replayed %q", text)
	}
	d := decode[events.Done](t, evs[len(evs)-1])
	if !d.Cached || d.Route != request.RouteCache || d.Usage.TotalTokens != 0 || d.KBVersion != version ||
		len(d.Timings) != 2 || d.Timings[1].Cache != "hit" {
		t.Fatalf("done %+v", d)
	}
	if len(fake.requests()) != 1 {
		t.Fatal("the cached answer called the LLM")
	}
	// A request that allows fewer tokens than the answer took misses.
	if got := h.lookup(t, "r3", 2); got.Hit {
		t.Fatal("a 3-token answer served to a request allowing 2")
	}
	if st := h.acts.Answers.Stats(); st.Hits != 1 || st.Misses != 2 || st.Bytes == 0 {
		t.Fatalf("answer cache stats %+v", st)
	}
}

// Routing at the exact boundary: a prompt bound equal to the threshold is
// short, one token more is long.
func TestAdmitRoutesAtTheExactThreshold(t *testing.T) {
	cfg := config.Default()
	h := newHarness(t, nil)
	bound := h.acts.Prompts.BoundBeforeRetrieval(query, cfg.Retrieval.TopK, cfg.Retrieval.ChunkTokens)
	for _, tc := range []struct {
		threshold int
		want      string
	}{{bound, request.PoolShort}, {bound - 1, request.PoolLong}} {
		h := newHarness(t, func(o *harnessOptions) { o.shortThreshold = tc.threshold })
		if out := h.admit(t, "r1", "granted"); out.Pool != tc.want || out.EstimatedPromptTokens != bound {
			t.Fatalf("threshold %d: %+v, want pool %s at bound %d", tc.threshold, out, tc.want, bound)
		}
	}
	// A bound counted before (by the answer-cache lookup) is routed by as
	// given, not counted again.
	h = newHarness(t, func(o *harnessOptions) { o.shortThreshold = bound })
	out := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{RequestID: "r2", Query: query, PromptBound: bound + 1})
	if out.Pool != request.PoolLong || out.EstimatedPromptTokens != bound+1 {
		t.Fatalf("admit with a given bound: %+v; want the long pool at %d", out, bound+1)
	}
}

// A finished request is reported once: to the metrics, and for a request
// that reached a pool, to the latency window shared across instances.
func TestFinalizeReportsTheRequest(t *testing.T) {
	h := newHarness(t, nil)
	m := metrics.New(quiet)
	w, err := latency.New(h.rdb, latency.Options{KeyPrefix: h.prefix})
	if err != nil {
		t.Fatal(err)
	}
	h.acts.Metrics, h.acts.Latency = m, w
	timings := []events.StageTiming{{Stage: "embed", Ms: 1, Cache: "miss"}, {Stage: "admission", Ms: 30000}}
	finalize(t, h, activities.FinalizeInput{
		RequestID: "r1", EventType: events.TypeRejected, Failure: &events.Failure{Reason: "queue_timeout"},
		Report: &activities.Report{Route: request.PoolShort, Outcome: "rejected", Reason: "queue_timeout", Timings: timings},
	})
	// Refused before routing: counted, but no pool's latency.
	finalize(t, h, activities.FinalizeInput{
		RequestID: "r2", EventType: events.TypeError, Failure: &events.Failure{Reason: "internal_error"},
		Report: &activities.Report{Outcome: "failed", Reason: "internal_error", Timings: timings[:1]},
	})
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sluice_requests_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			var outcome, route string
			for _, l := range mt.GetLabel() {
				switch l.GetName() {
				case "outcome":
					outcome = l.GetValue()
				case "route":
					route = l.GetValue()
				}
			}
			counts[outcome+"/"+route] = mt.GetCounter().GetValue()
		}
	}
	if counts["rejected_queue_timeout/short"] != 1 || counts["failed/"] != 1 || len(counts) != 2 {
		t.Fatalf("requests_total %v", counts)
	}
	ctx := context.Background()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := w.Snapshots(ctx, time.Minute, latency.Series("admission", "short"), latency.Series("requests", "short"),
		latency.Series("queue_timeouts", "short"), latency.Series("embed", ""))
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Count != 1 || st[0].P50 < 28*time.Second || st[1].Added != 1 || st[2].Added != 1 || st[3].Count != 0 {
		t.Fatalf("latency window %+v", st)
	}
	// Time to first token: the stages before it and the first token, not
	// the rest of the answer; only requests that got a first token.
	finalize(t, h, activities.FinalizeInput{RequestID: "r3", Report: &activities.Report{Route: request.PoolLong, Outcome: "done", Timings: []events.StageTiming{
		{Stage: "embed", Ms: 100}, {Stage: "admission", Ms: 2000}, {Stage: "retrieval", Ms: 300},
		{Stage: "llm_first_token", Ms: 600}, {Stage: "llm", Ms: 9000},
	}}})
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st, err = w.Snapshots(ctx, time.Minute, latency.Series(request.SeriesTTFT, "long"), latency.Series(request.SeriesTTFT, "short"))
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Count != 1 || st[0].P50 < 2850*time.Millisecond || st[0].P50 > 3150*time.Millisecond || st[1].Count != 0 {
		t.Fatalf("ttft %+v, want one of 3 s in the long pool and none in the short (no first token)", st)
	}
}
