package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
	"github.com/sluice-dev/sluice/workflows/signal"
)

type stream struct {
	resp *http.Response
	r    *testenv.SSEReader
	id   string
}

// open starts a request (POST /v1/chat) or resumes one (GET .../events).
func open(t *testing.T, ctx context.Context, method, path, body string, header map[string]string) *stream {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, stack.baseURL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	return &stream{resp: resp, r: testenv.NewSSEReader(resp.Body), id: resp.Header.Get("X-Request-ID")}
}

func chat(t *testing.T, ctx context.Context, body string) *stream {
	return open(t, ctx, http.MethodPost, "/v1/chat", body, nil)
}

// The reservation charged at the door is reconciled when the request ends:
// what stays charged is what the request actually used.
func TestRateLimitReservationIsReconciled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Start from a full bucket: it barely refills, and an earlier run
	// (-count=N) would still be charged.
	if err := stack.redis.Del(ctx, keyPrefix+"rl3:{t:slowco}:tenant:slowco:tokens").Err(); err != nil {
		t.Fatal(err)
	}
	s := open(t, ctx, http.MethodPost, "/v1/chat", `{"query":"What is a leased semaphore?","max_tokens":40}`,
		map[string]string{"Authorization": "Bearer k-slow"})
	defer s.close()
	if s.resp.Header.Get("X-RateLimit-Limit-Tokens") != "100000" || s.resp.Header.Get("X-RateLimit-Remaining-Tokens") == "" {
		t.Fatalf("rate-limit headers %v", s.resp.Header)
	}
	evs := s.until(t, terminal)
	var done events.Done
	if last := evs[len(evs)-1]; last.Event != events.TypeDone || last.Decode(&done) != nil {
		t.Fatalf("ended with %+v", last)
	}
	result(t, s.id) // finalize, and so the refund, has run
	raw, err := stack.redis.Get(ctx, keyPrefix+"rl3:{t:slowco}:tenant:slowco:tokens").Result()
	if err != nil {
		t.Fatal(err)
	}
	level, ok := limiter.StoredLevel(raw)
	if !ok {
		t.Fatalf("bucket state %q", raw)
	}
	want := 100000 - float64(done.Usage.TotalTokens)
	// The bucket refills 1 token a second while the request runs.
	if level < want-1 || level > want+10 {
		t.Fatalf("bucket holds %.1f after the request, want about %.0f (capacity minus the %d tokens used)", level, want, done.Usage.TotalTokens)
	}
	in := chatInput(t, s.id)
	if in.RateReservation == "" {
		t.Fatal("the workflow was started without its rate-limit reservation")
	}
	// A reservation is "r1\n<hash>\n<field>\n<buckets…>"; the refund
	// deleted its field.
	rsv := strings.Split(in.RateReservation, "\n")
	if n, err := stack.redis.HExists(ctx, rsv[1], rsv[2]).Result(); err != nil || n {
		t.Fatalf("the reservation was not consumed by its refund: %v %v", n, err)
	}
}

// until reads events until stop returns true (that event included).
func (s *stream) until(t *testing.T, stop func(testenv.SSEEvent) bool) []testenv.SSEEvent {
	t.Helper()
	var evs []testenv.SSEEvent
	for {
		ev, err := s.r.Next()
		if err != nil {
			t.Fatalf("stream ended after %d events (%v): %+v", len(evs), err, evs)
		}
		if ev.ID == "" || !events.ValidID(ev.ID) {
			t.Fatalf("event without a valid id: %+v", ev)
		}
		evs = append(evs, ev)
		if stop(ev) {
			return evs
		}
	}
}

func terminal(ev testenv.SSEEvent) bool { return events.Terminal(ev.Event) }

func (s *stream) close() { s.resp.Body.Close() }

// chatInput is the input a request's workflow was started with.
func chatInput(t *testing.T, id string) workflows.ChatInput {
	t.Helper()
	ctx := context.Background()
	it := stack.temporal.GetWorkflowHistory(ctx, workflows.ChatWorkflowID(id), "", false, 0)
	ev, err := it.Next()
	if err != nil {
		t.Fatalf("read history of %s: %v", id, err)
	}
	var in workflows.ChatInput
	payloads := ev.GetWorkflowExecutionStartedEventAttributes().GetInput()
	if err := converter.GetDefaultDataConverter().FromPayloads(payloads, &in); err != nil {
		t.Fatalf("decode input of %s: %v", id, err)
	}
	return in
}

func result(t *testing.T, id string) workflows.ChatResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r workflows.ChatResult
	if err := stack.temporal.GetWorkflow(ctx, workflows.ChatWorkflowID(id), "").Get(ctx, &r); err != nil {
		t.Fatalf("workflow %s: %v", id, err)
	}
	return r
}

// assertPoolsIdle checks that every permit and queue entry was given back.
func assertPoolsIdle(t *testing.T) {
	t.Helper()
	for _, pool := range []string{"short", "long"} {
		st, err := stack.gate.Stats(context.Background(), pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.InUse != 0 || st.Waiting != 0 {
			t.Fatalf("pool %s not idle after the request: %+v", pool, st)
		}
	}
}

func TestChatStreamsEveryStageThenDone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := chat(t, ctx, `{"query":"How does a token bucket refill?","max_tokens":40}`)
	defer s.close()
	evs := s.until(t, terminal)

	var acc events.Accepted
	if evs[0].Event != events.TypeAccepted || evs[0].Decode(&acc) != nil || acc.RequestID != s.id {
		t.Fatalf("first event %+v, want accepted for %s", evs[0], s.id)
	}
	var stages []string
	var text strings.Builder
	tokens, notices := 0, 0
	for _, ev := range evs {
		switch ev.Event {
		case events.TypeStage:
			var st events.Stage
			_ = ev.Decode(&st)
			stages = append(stages, st.Stage)
		case events.TypeToken:
			var tok events.Token
			_ = ev.Decode(&tok)
			if tok.Index != tokens {
				t.Fatalf("token %d has index %d", tokens, tok.Index)
			}
			text.WriteString(tok.Text)
			tokens++
			if tok.Notice {
				notices++
			}
		}
	}
	if got := strings.Join(stages, ","); got != "embed,admission,retrieval,rerank,llm" {
		t.Fatalf("stages %s", got)
	}
	last := evs[len(evs)-1]
	var done events.Done
	if last.Event != events.TypeDone || last.Decode(&done) != nil {
		t.Fatalf("last event %+v, want done", last)
	}
	// The model's tokens, then the notice that the answer was cut, marked
	// as Sluice's.
	if done.Usage.CompletionTokens != tokens-1 || tokens <= 1 || done.FinishReason != "length" || done.Route != "short" ||
		!strings.HasSuffix(text.String(), stack.cfg.LLM.TruncationNotice) || notices != 1 {
		t.Fatalf("done %+v after %d token events", done, tokens)
	}
	if done.Usage.PromptTokens < 50 {
		t.Fatalf("prompt tokens %d: the retrieved context is missing", done.Usage.PromptTokens)
	}
	if len(done.Timings) < 5 || strings.TrimSpace(text.String()) == "" {
		t.Fatalf("timings %+v, text %q", done.Timings, text.String())
	}

	r := result(t, s.id)
	if r.Outcome != request.OutcomeDone || r.Route != "short" {
		t.Fatalf("workflow result %+v", r)
	}
	assertPoolsIdle(t)
	recordHistory(t, s.id, "chat_done")

	// The request is findable in Temporal by its search attributes.
	desc, err := stack.temporal.DescribeWorkflow(ctx, workflows.ChatWorkflowID(s.id), "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for name, p := range desc.RawResponse.GetWorkflowExecutionInfo().GetSearchAttributes().GetIndexedFields() {
		var v string
		_ = converter.GetDefaultDataConverter().FromPayload(p, &v)
		got[name] = v
	}
	for k, want := range map[string]string{"SluiceTenant": "anonymous", "SluiceRoute": "short", "SluiceOutcome": "done"} {
		if got[k] != want {
			t.Errorf("search attribute %s = %q, want %q (all: %v)", k, got[k], want, got)
		}
	}

	// Resuming after the final event ends at once: 204, nothing appended.
	resume, _ := http.NewRequest(http.MethodGet, stack.baseURL+"/v1/requests/"+s.id+"/events", nil)
	resume.Header.Set("Last-Event-ID", last.ID)
	if resp, err := http.DefaultClient.Do(resume); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("resume after done: %v %v", resp, err)
	}
	if l, _, _ := lastEvent(s.id); l.ID != last.ID {
		t.Fatalf("resume after done appended %+v", l)
	}

	// Another tenant cannot see or cancel it.
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		req, _ := http.NewRequest(method, stack.baseURL+"/v1/requests/"+s.id, nil)
		req.Header.Set("Authorization", "Bearer k-acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s by another tenant: %d, want 404", method, resp.StatusCode)
		}
	}

	// GET /v1/requests/:id reports the finished request.
	resp, err := http.Get(stack.baseURL + "/v1/requests/" + s.id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"workflow_status":"completed"`) || !strings.Contains(string(body), `"stage":"finished"`) {
		t.Fatalf("GET request: %d %s", resp.StatusCode, body)
	}
}

func TestDisconnectCancelsRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := chat(t, ctx, `{"query":"Explain continuous batching in detail","max_tokens":1000}`)
	tokens := 0
	s.until(t, func(ev testenv.SSEEvent) bool {
		if ev.Event == events.TypeToken {
			tokens++
		}
		return tokens == 3 || terminal(ev)
	})
	s.close()

	r := result(t, s.id)
	if r.Outcome != request.OutcomeCancelled {
		t.Fatalf("outcome %q after disconnect, want cancelled", r.Outcome)
	}
	assertPoolsIdle(t)
	recordHistory(t, s.id, "chat_disconnected")
	last, ok, err := lastEvent(s.id)
	if err != nil || !ok || last.Type != events.TypeError || !strings.Contains(string(last.Data), "cancelled") {
		t.Fatalf("last event %+v %v %v", last, ok, err)
	}
}

func TestResumeWithLastEventIDLosesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := chat(t, ctx, `{"query":"What is a leased semaphore?","max_tokens":120}`)
	var first []testenv.SSEEvent
	n := 0
	first = s.until(t, func(ev testenv.SSEEvent) bool {
		if ev.Event == events.TypeToken {
			n++
		}
		return n == 10
	})
	lastID := first[len(first)-1].ID
	s.close()

	// Reconnect inside the grace period.
	rs := open(t, ctx, http.MethodGet, "/v1/requests/"+s.id+"/events", "", map[string]string{"Last-Event-ID": lastID})
	defer rs.close()
	rest := rs.until(t, terminal)

	idx := 0
	for _, ev := range append(first, rest...) {
		if ev.Event != events.TypeToken {
			continue
		}
		var tok events.Token
		_ = ev.Decode(&tok)
		if tok.Index != idx {
			t.Fatalf("token index %d, want %d: a token was lost or repeated across the reconnect", tok.Index, idx)
		}
		idx++
	}
	var done events.Done
	if last := rest[len(rest)-1]; last.Event != events.TypeDone || last.Decode(&done) != nil {
		t.Fatalf("resumed stream ended with %+v", last)
	}
	// An answer cut at max_tokens ends with one more token event: the notice.
	if done.FinishReason == "length" {
		idx--
	}
	if done.Usage.CompletionTokens != idx {
		t.Fatalf("saw %d tokens, done says %d", idx, done.Usage.CompletionTokens)
	}
	if r := result(t, s.id); r.Outcome != request.OutcomeDone {
		t.Fatalf("outcome %q", r.Outcome)
	}
	recordHistory(t, s.id, "chat_resumed")
}

func TestDeleteCancelsRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := chat(t, ctx, `{"query":"Tell me about Redis streams","max_tokens":1000}`)
	defer s.close()
	s.until(t, func(ev testenv.SSEEvent) bool { return ev.Event == events.TypeToken })

	req, _ := http.NewRequest(http.MethodDelete, stack.baseURL+"/v1/requests/"+s.id, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	evs := s.until(t, terminal)
	var f events.Failure
	if last := evs[len(evs)-1]; last.Event != events.TypeError || last.Decode(&f) != nil || f.Reason != request.ReasonCancelled {
		t.Fatalf("stream ended with %+v", last)
	}
	if r := result(t, s.id); r.Outcome != request.OutcomeCancelled {
		t.Fatalf("outcome %q", r.Outcome)
	}
	assertPoolsIdle(t)
	recordHistory(t, s.id, "chat_cancel_signal")

	// A second DELETE finds the request finished.
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("DELETE of a finished request: %d, want 409", resp.StatusCode)
	}
}

// holdShortPool takes every permit of the short pool for fake holders.
func holdShortPool(t *testing.T) []string {
	t.Helper()
	var ids []string
	for i := 0; i < stack.cfg.Pools.Short.MaxConcurrency; i++ {
		// Unique per run: a released id stays refused for a while, also
		// under -count=N.
		id := fmt.Sprintf("holder-%s-%d-%d", t.Name(), time.Now().UnixNano(), i)
		r, err := stack.gate.Enqueue(context.Background(), "short", admission.Request{ID: id, Tenant: "holders", Weight: 1})
		if err != nil || r.Status != admission.Granted {
			t.Fatalf("hold permit: %+v %v", r, err)
		}
		ids = append(ids, id)
	}
	t.Cleanup(func() {
		for _, id := range ids {
			_, _ = stack.gate.Release(context.Background(), "short", id)
		}
	})
	return ids
}

func TestQueueTimeoutRejectsWithRetryAfter(t *testing.T) {
	holdShortPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	s := chat(t, ctx, `{"query":"What is weighted fair queuing?","max_tokens":20}`)
	defer s.close()
	evs := s.until(t, terminal)

	var q events.Queue
	sawQueue := false
	for _, ev := range evs {
		if ev.Event == events.TypeQueue && ev.Decode(&q) == nil && q.Position == 1 && q.Pool == "short" {
			sawQueue = true
		}
		if ev.Event == events.TypeToken {
			t.Fatal("a request that never got a permit streamed tokens")
		}
	}
	if !sawQueue {
		t.Fatalf("no queue event at position 1: %+v", evs)
	}
	var f events.Failure
	last := evs[len(evs)-1]
	if last.Event != events.TypeRejected || last.Decode(&f) != nil || f.Reason != request.ReasonQueueTimeout || f.RetryAfterS < 1 || f.Message == "" {
		t.Fatalf("ended with %+v", last)
	}
	if waited := time.Since(start); waited < stack.cfg.Admission.MaxWait {
		t.Fatalf("rejected after %v, before maxWait %v", waited, stack.cfg.Admission.MaxWait)
	}
	if r := result(t, s.id); r.Outcome != request.OutcomeRejected || r.Reason != request.ReasonQueueTimeout {
		t.Fatalf("result %+v", r)
	}
	if _, queued, _ := stack.gate.Position(ctx, "short", s.id); queued {
		t.Fatal("timed-out request still in the queue")
	}
	recordHistory(t, s.id, "chat_queue_timeout")
}

// A request of a class that refuses late requests waits no longer than
// its deadline, its class's TTFT SLO, however long its tier's max wait,
// and is told why, with when to come back.
func TestDeadlineRejectsAtTheClassSLO(t *testing.T) {
	holdShortPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	s := open(t, ctx, http.MethodPost, "/v1/chat", `{"query":"What is weighted fair queuing?","max_tokens":20}`,
		map[string]string{"Authorization": "Bearer k-deadline"})
	defer s.close()
	evs := s.until(t, terminal)
	var f events.Failure
	last := evs[len(evs)-1]
	if last.Event != events.TypeRejected || last.Decode(&f) != nil || f.Reason != request.ReasonDeadlineUnreachable || f.RetryAfterS < 1 ||
		!strings.Contains(f.Message, "time to first token of 3s") {
		t.Fatalf("ended with %+v", last)
	}
	if waited := time.Since(start); waited < 3*time.Second || waited > 15*time.Second {
		t.Fatalf("rejected after %v, want at its 3 s deadline, long before the tier's 45 s", waited)
	}
	if r := result(t, s.id); r.Outcome != request.OutcomeRejected || r.Reason != request.ReasonDeadlineUnreachable {
		t.Fatalf("result %+v", r)
	}
	if _, queued, _ := stack.gate.Position(ctx, "short", s.id); queued {
		t.Fatal("rejected request still in the queue")
	}
	recordHistory(t, s.id, "chat_deadline_unreachable")
}

func TestQueuedRequestIsAdmittedWhenAPermitIsReleased(t *testing.T) {
	holders := holdShortPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := chat(t, ctx, `{"query":"How do leases protect against crashed holders?","max_tokens":20}`)
	defer s.close()
	s.until(t, func(ev testenv.SSEEvent) bool { return ev.Event == events.TypeQueue })
	// Past its fast wait the request parks in its workflow: one timer for
	// its whole max wait, no re-checks.
	waitForTimer(t, ctx, s.id)

	// Release one permit the way a finishing request does: the permit is
	// handed to the waiter and the waiter's workflow is signalled.
	rel, err := stack.gate.Release(ctx, "short", holders[0])
	if err != nil || len(admission.IDs(rel.Woken)) != 1 || admission.IDs(rel.Woken)[0] != s.id {
		t.Fatalf("release: %+v %v", rel, err)
	}
	if err := admission.Wake(ctx, stack.gate, signal.Notifier{Client: stack.temporal}, rel.Woken); err != nil {
		t.Fatal(err)
	}
	evs := s.until(t, terminal)
	if last := evs[len(evs)-1]; last.Event != events.TypeDone {
		t.Fatalf("ended with %+v", last)
	}
	if r := result(t, s.id); r.Outcome != request.OutcomeDone {
		t.Fatalf("outcome %q", r.Outcome)
	}
	if n := countEvents(t, s.id, enums.EVENT_TYPE_TIMER_STARTED); n != 1 {
		t.Fatalf("%d timers started while waiting, want 1 (no re-checks)", n)
	}
	recordHistory(t, s.id, "chat_admitted_by_signal")
}

// waitForTimer waits until the request's workflow has started a timer.
func waitForTimer(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	for countEvents(t, id, enums.EVENT_TYPE_TIMER_STARTED) == 0 {
		if ctx.Err() != nil {
			t.Fatalf("request %s never parked on a timer", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countEvents counts the events of one type in the request's history.
func countEvents(t *testing.T, id string, typ enums.EventType) int {
	t.Helper()
	it := stack.temporal.GetWorkflowHistory(context.Background(), workflows.ChatWorkflowID(id), "", false, 0)
	n := 0
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.EventType == typ {
			n++
		}
	}
	return n
}

func lastEvent(id string) (events.Event, bool, error) {
	log := events.NewLog(stack.redis, events.LogOptions{KeyPrefix: keyPrefix})
	return log.Last(context.Background(), id)
}
