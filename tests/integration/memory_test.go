package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
)

// simCompleted counts the requests the LLM simulator answered.
func simCompleted() int64 {
	var n int64
	for _, r := range stack.sim.Stats().Replicas {
		n += r.Completed
	}
	return n
}

// answer sends a chat request and returns the streamed text and the done
// event once its workflow has ended (and so given back its permit).
func answer(t *testing.T, ctx context.Context, body string) (string, events.Done, string) {
	t.Helper()
	return answerAs(t, ctx, "", body)
}

// answerAs is answer with an API key ("" for none).
func answerAs(t *testing.T, ctx context.Context, key, body string) (string, events.Done, string) {
	t.Helper()
	var header map[string]string
	if key != "" {
		header = map[string]string{"Authorization": "Bearer " + key}
	}
	s := open(t, ctx, http.MethodPost, "/v1/chat", body, header)
	defer s.close()
	evs := s.until(t, terminal)
	var text strings.Builder
	for _, ev := range evs {
		if ev.Event == events.TypeToken {
			var tok events.Token
			if err := ev.Decode(&tok); err != nil {
				t.Fatal(err)
			}
			text.WriteString(tok.Text)
		}
	}
	var done events.Done
	if last := evs[len(evs)-1]; last.Event != events.TypeDone || last.Decode(&done) != nil {
		t.Fatalf("ended with %+v", last)
	}
	if r := result(t, s.id); r.Route != done.Route {
		t.Fatalf("workflow route %q, done says %q", r.Route, done.Route)
	}
	return text.String(), done, s.id
}

// An allow-listed kb answers a repeated question from the answer cache,
// through the same events, with no permit and no LLM call; a change to the
// kb makes the cached answer unreachable.
func TestAnswerCacheEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	doJSON(t, ctx, "POST", "/v1/kb/it-cached/documents",
		`{"id":"tides","title":"Tides","text":"Tides are caused mainly by the gravitational pull of the Moon on the oceans."}`, nil)
	const q = `{"query":"What causes the tides?","kb":"it-cached","max_tokens":1000}`
	first, d1, _ := answer(t, ctx, q)
	if d1.Cached || d1.FinishReason != "stop" || d1.Route == "cache" {
		t.Fatalf("first answer %+v", d1)
	}
	requests := simCompleted()
	second, d2, id := answer(t, ctx, q)
	recordHistory(t, id, "chat_answer_cache_hit")
	if !d2.Cached || d2.Route != "cache" || d2.KBVersion != d1.KBVersion || second != first || d2.Usage.TotalTokens != 0 {
		t.Fatalf("second answer %+v (same text: %v)", d2, second == first)
	}
	if got := simCompleted(); got != requests {
		t.Fatalf("the cached answer reached the LLM (%d requests, was %d)", got, requests)
	}
	doJSON(t, ctx, "POST", "/v1/kb/it-cached/documents",
		`{"id":"moon","title":"Moon","text":"The Moon orbits the Earth about once every 27 days."}`, nil)
	_, d3, _ := answer(t, ctx, q)
	if d3.Cached || d3.KBVersion != d1.KBVersion+1 {
		t.Fatalf("after a kb change: %+v", d3)
	}
	assertPoolsIdle(t)
}

// A session keeps its turns; the API returns and forgets them.
func TestSessionTurnsThroughTheAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first, d1, _ := answer(t, ctx, `{"query":"How does a token bucket refill?","session_id":"it-s1","max_tokens":8}`)
	if d1.FinishReason != "length" || !strings.HasSuffix(first, stack.cfg.LLM.TruncationNotice) {
		t.Fatalf("an answer cut at max_tokens ends %q (finish %q)", first, d1.FinishReason)
	}
	second, _, id := answer(t, ctx, `{"query":"And how fast?","session_id":"it-s1","max_tokens":500}`)
	recordHistory(t, id, "chat_session_turn")
	var got struct {
		ID    string         `json:"id"`
		Turns []session.Turn `json:"turns"`
	}
	doJSON(t, ctx, "GET", "/v1/sessions/it-s1", "", &got)
	if len(got.Turns) != 2 || got.Turns[0].Query != "How does a token bucket refill?" || got.Turns[0].Answer != first ||
		got.Turns[0].Outcome != request.OutcomeTruncated || got.Turns[1].Answer != second || got.Turns[1].Outcome != request.OutcomeDone {
		t.Fatalf("session %+v", got)
	}
	// Sessions are their user's: another tenant's key does not see this
	// one (tenancy_test.go tries another user of the same tenant).
	req, _ := http.NewRequestWithContext(ctx, "GET", stack.baseURL+"/v1/sessions/it-s1", nil)
	req.Header.Set("Authorization", "Bearer k-acme")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("another tenant reads the session: %v %v", resp.StatusCode, err)
	}
	doJSON(t, ctx, "DELETE", "/v1/sessions/it-s1", "", nil)
	req, _ = http.NewRequestWithContext(ctx, "GET", stack.baseURL+"/v1/sessions/it-s1", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("forgotten session: %v %v", resp.StatusCode, err)
	}
}

// A request the queue turns away is recorded in its session.
func TestSessionRecordsQueueTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	holdShortPool(t)
	s := chat(t, ctx, `{"query":"Is anyone there?","session_id":"it-busy","max_tokens":8}`)
	evs := s.until(t, terminal)
	s.close()
	result(t, s.id)
	if last := evs[len(evs)-1]; last.Event != events.TypeRejected {
		t.Fatalf("ended with %+v", last)
	}
	var got struct {
		Turns []session.Turn `json:"turns"`
	}
	doJSON(t, ctx, "GET", "/v1/sessions/it-busy", "", &got)
	if len(got.Turns) != 1 || got.Turns[0].Outcome != request.OutcomeRejected || got.Turns[0].Reason != "queue_timeout" {
		t.Fatalf("session %+v", got)
	}
}
