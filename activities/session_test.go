package activities_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
)

// alice is the owner of the tests' sessions.
var alice = session.Owner{Tenant: "acme", User: "alice"}

func (h *harness) turns(t *testing.T, o session.Owner, id string) []session.Turn {
	t.Helper()
	turns, err := h.acts.Sessions.Turns(context.Background(), o, id)
	if err != nil {
		t.Fatal(err)
	}
	return turns
}

// history returns the earlier turns a prompt carried: the messages
// between the system message and the query.
func history(msgs []openai.Message) []openai.Message { return msgs[1 : len(msgs)-1] }

// textOf is a message's text.
func textOf(m openai.Message) string {
	text, err := m.Text()
	if err != nil {
		panic(err)
	}
	return text
}

func TestSecondTurnCarriesTheFirst(t *testing.T) {
	fake := &fakeLLM{tokens: []string{"Buckets", " refill", " steadily."}}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	ref := &activities.SessionRef{Tenant: "acme", User: "alice", ID: "s1", HistoryTokens: 1024}
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
	if len(got) != 2 || got[0].Role != "user" || textOf(got[0]) != "How do buckets refill?" ||
		got[1].Role != "assistant" || textOf(got[1]) != "Buckets refill steadily." {
		t.Fatalf("the second turn carried %+v", got)
	}
	if last := reqs[1].Messages[len(reqs[1].Messages)-1]; textOf(last) != "And how fast?" {
		t.Fatalf("the query is not last: %+v", last)
	}
	turns := h.turns(t, alice, "s1")
	if len(turns) != 2 || turns[1].RequestID != "r2" || turns[1].Outcome != request.OutcomeDone {
		t.Fatalf("turns %+v", turns)
	}
	// Another tenant's, or another user's, session of the same name is
	// another session.
	for _, o := range []session.Owner{{Tenant: "globex", User: "alice"}, {Tenant: "acme", User: "bob"}} {
		if other := h.turns(t, o, "s1"); len(other) != 0 {
			t.Fatalf("%+v sees %+v", o, other)
		}
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
		if err := h.acts.Sessions.Append(ctx, alice, "s", turn); err != nil {
			t.Fatal(err)
		}
	}
	stored := session.Exchanges(h.turns(t, alice, "s"))
	const budget = 200
	want, used := h.acts.Prompts.FitHistory(stored, budget)
	if len(want) == 0 || len(want) == len(stored) || used > budget {
		t.Fatalf("test needs a budget that keeps some turns: kept %d of %d in %d tokens", len(want), len(stored), used)
	}
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version,
		Context: hits, MaxTokens: 8, Session: &activities.SessionRef{Tenant: "acme", User: "alice", ID: "s", HistoryTokens: budget},
	}, nil); err != nil {
		t.Fatal(err)
	}
	got := history(fake.requests()[0].Messages)
	if len(got) != 2*len(want) {
		t.Fatalf("prompt carried %d messages of history, want %d", len(got), 2*len(want))
	}
	// The newest turn is the last before the query.
	if newest := stored[len(stored)-1]; textOf(got[len(got)-2]) != newest.User {
		t.Fatalf("newest turn in the prompt is %q, want %q", textOf(got[len(got)-2]), newest.User)
	}
}

func TestAdmitRoutesWithSessionHistory(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	// A long earlier answer pushes a short question past the threshold.
	turn := session.Turn{RequestID: "old", Query: "Tell me everything.", Answer: strings.Repeat("token bucket ", 300), Outcome: request.OutcomeDone}
	if err := h.acts.Sessions.Append(ctx, alice, "long", turn); err != nil {
		t.Fatal(err)
	}
	alone := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{RequestID: "r1", Query: "And then?", Tenant: "acme"})
	if alone.Pool != request.PoolShort || alone.HistoryTokens != 0 {
		t.Fatalf("without its session: %+v", alone)
	}
	with := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "r2", Query: "And then?", Tenant: "acme",
		Session: &activities.SessionRef{Tenant: "acme", User: "alice", ID: "long", HistoryTokens: 4096},
	})
	if with.Pool != request.PoolLong || with.HistoryTokens == 0 || with.EstimatedPromptTokens != alone.EstimatedPromptTokens+with.HistoryTokens {
		t.Fatalf("with its session: %+v (alone %+v)", with, alone)
	}
}

func TestFinalizeRecordsWhatBecameOfTheRequest(t *testing.T) {
	h := newHarness(t, nil)
	ref := activities.SessionRef{Tenant: "acme", User: "alice", ID: "s"}
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
	turns := h.turns(t, alice, "s")
	if len(turns) != 2 || turns[0].Outcome != request.OutcomeRejected || turns[0].Reason != "queue_timeout" ||
		turns[1].Answer != "Yes, it is." {
		t.Fatalf("turns %+v", turns)
	}
	if e := turns[0].Exchange(); !strings.Contains(e.Assistant, "busy") {
		t.Fatalf("a rejected turn reads %q to the model", e.Assistant)
	}
}
