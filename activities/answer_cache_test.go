package activities_test

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/request"
)

func (h *harness) lookup(t *testing.T, requestID string, maxTokens int) activities.LookupAnswerOutput {
	t.Helper()
	return mustLocal[activities.LookupAnswerOutput](t, h, h.acts.LookupAnswer, activities.LookupAnswerInput{
		RequestID: requestID, Query: query, KB: kbName, MaxTokens: maxTokens,
		Done: &activities.DoneFacts{RequestID: requestID, Timings: []events.StageTiming{{Stage: "embed", Ms: 1}}},
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
