package activities_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
)

// pausingHarness is a harness whose short pool (one permit) is served by
// a simulator that continues answers, at real time so that a stream of
// 300 tokens lasts seconds, with preemption on.
func pausingHarness(t *testing.T, continues bool) *harness {
	t.Helper()
	return pausingHarnessWith(t, continues, admission.PauseRules{MinTokens: 5, MaxPauses: 2})
}

// pausingHarnessWith is pausingHarness with rules, whose Asker asks again
// for urgent waiters.
func pausingHarnessWith(t *testing.T, continues bool, rules admission.PauseRules) *harness {
	t.Helper()
	_, srv := simulator(t, func(c *llmsim.Config) {
		c.TimeScale = 1
		c.AnswerMinTokens, c.AnswerMaxTokens = 300, 300
	})
	opts := llm.OpenAIOptions{Name: request.PoolShort, Endpoints: []string{srv.URL}}
	if continues {
		opts.Continuation = llm.ContinuationVLLM
	}
	client, err := llm.NewOpenAI(opts)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
	pool := h.acts.Pools[request.PoolShort]
	pool.Continues = continues
	h.acts.Pools[request.PoolShort] = pool
	h.acts.Options.Preemption = activities.Preemption{Enabled: true, From: map[string]bool{request.PoolShort: continues},
		PauseRules: rules}
	h.acts.Asker = admission.NewAsker(h.gate, h.acts.Waker, rules, quiet)
	t.Cleanup(h.acts.Asker.Close)
	return h
}

// tokenTexts is requestID's tokens as its client reads them, failing on a
// token whose index is not the next.
func tokenTexts(t *testing.T, h *harness, requestID string) []string {
	t.Helper()
	var out []string
	for i, ev := range ofType(h.events(t, requestID), events.TypeToken) {
		var tok events.Token
		if err := json.Unmarshal(ev.Data, &tok); err != nil || tok.Index != i {
			t.Fatalf("%s: token %d has index %d (%v)", requestID, i, tok.Index, err)
		}
		out = append(out, tok.Text)
	}
	return out
}

// admitUrgent admits a priority request once the stream holding the
// pool's permit has offered itself for a pause, and returns whether it
// was queued (the permit was busy).
func admitUrgent(t *testing.T, h *harness, id, tier string) activities.AdmitOutput {
	t.Helper()
	return mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: id, Query: query, Pool: request.PoolShort, Tenant: "t-" + id, Weight: 1, ServiceTier: tier,
	})
}

// waitPausable waits until requestID has offered itself for pausing (its
// keep-alive's first round after the start, a second in).
func waitPausable(t *testing.T, h *harness, requestID string) {
	t.Helper()
	key := h.prefix + "adm:{" + request.PoolShort + "}:pausable"
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if h.rdb.HExists(context.Background(), key, requestID).Val() {
			return
		}
	}
	t.Fatalf("%s never offered itself for pausing", requestID)
}

// A flex stream is paused for a priority request: the urgent request is
// granted its permit while the flex answer is unfinished, and the flex
// stream, granted again when the urgent one gives the permit back,
// continues its answer on the simulator: its client receives every token
// of the answer an unbroken stream gives, exactly once and in order, and
// its usage counts each once.
func TestStreamLLMPausedForAPriorityRequestCompletes(t *testing.T) {
	h := pausingHarness(t, true)
	m := metrics.New(quiet)
	h.acts.Metrics = m
	input := func(id string) activities.LLMInput {
		return activities.LLMInput{RequestID: id, Pool: request.PoolShort, Query: query, KB: kbName, MaxTokens: 400,
			ServiceTier: request.ClassFlex, Weight: 1}
	}
	whole, err := stream(t, h, input("r0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := tokenTexts(t, h, "r0")
	if _, err := h.gate.Release(t.Context(), request.PoolShort, "r0"); err != nil {
		t.Fatal(err)
	}

	type result struct {
		out activities.LLMOutput
		err error
	}
	done := make(chan result, 1)
	go func() {
		in := input("flex")
		in.Done = &activities.DoneFacts{RequestID: "flex", ServiceTier: request.ClassFlex}
		out, err := stream(t, h, in, nil)
		done <- result{out, err}
	}()
	waitPausable(t, h, "flex")
	asked := time.Now()
	if adm := admitUrgent(t, h, "urgent", request.ClassPriority); adm.Granted {
		t.Fatalf("urgent granted at once while flex held the only permit: %+v", adm)
	}
	// The flex stream pauses at its next keep-alive round and hands the
	// permit over.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if slices.Contains(h.notifier.woken(), request.PoolShort+"/urgent") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("urgent was never granted the flex stream's permit")
		}
	}
	t.Logf("urgent granted the paused stream's permit %v after it queued", time.Since(asked).Round(time.Millisecond))
	paused := len(tokenTexts(t, h, "flex"))
	if paused == 0 || paused >= len(want) {
		t.Fatalf("flex had %d of %d tokens when it paused", paused, len(want))
	}
	if _, err := h.gate.ReleaseAndWake(t.Context(), h.notifier, request.PoolShort, "urgent"); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	got := tokenTexts(t, h, "flex")
	if strings.Join(got, "") != strings.Join(want, "") || len(got) != len(want) {
		t.Fatalf("paused answer (%d tokens) %q\nwant (%d) %q", len(got), strings.Join(got, ""), len(want), strings.Join(want, ""))
	}
	if r.out.Usage.CompletionTokens != whole.Usage.CompletionTokens || r.out.Usage.PromptTokens != whole.Usage.PromptTokens || r.out.FinishReason != whole.FinishReason {
		t.Errorf("paused usage %+v finish %s, unbroken %+v finish %s", r.out.Usage, r.out.FinishReason, whole.Usage, whole.FinishReason)
	}
	if h.rdb.HExists(t.Context(), h.prefix+"adm:{"+request.PoolShort+"}:pausable", "flex").Val() {
		t.Error("the ended stream is still offered for pausing")
	}
	if r.out.Pauses != 1 {
		t.Errorf("%d pauses reported, want 1", r.out.Pauses)
	}
	if n := counterOf(t, m, "sluice_admission_pauses_total", request.PoolShort); n != 1 {
		t.Errorf("sluice_admission_pauses_total %v, want 1", n)
	}
	// The client learns it from the done event.
	var d events.Done
	if dones := ofType(h.events(t, "flex"), events.TypeDone); len(dones) != 1 {
		t.Errorf("%d done events, want 1", len(dones))
	} else if err := json.Unmarshal(dones[0].Data, &d); err != nil || d.Pauses != 1 {
		t.Errorf("done event pauses %d (%v), want 1", d.Pauses, err)
	}
	if n := len(ofType(h.events(t, "flex"), events.TypeStage)); n != 1 {
		t.Errorf("%d stage events, want the one llm stage", n)
	}
}

// An urgent request that queued while the only stream was within its
// first MinTokens tokens pauses it once it has streamed them, without
// asking again itself: the stream announces that it may be paused, and
// the Asker asks for the waiter.
func TestStreamLLMPausedOnceItMayBe(t *testing.T) {
	h := pausingHarnessWith(t, true, admission.PauseRules{MinTokens: 100, MaxPauses: 2})
	done := make(chan error, 1)
	go func() {
		_, err := stream(t, h, activities.LLMInput{RequestID: "flex", Pool: request.PoolShort, Query: query, KB: kbName,
			MaxTokens: 400, ServiceTier: request.ClassFlex, Weight: 1}, nil)
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); len(ofType(h.events(t, "flex"), events.TypeToken)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("flex never streamed")
		}
	}
	if adm := admitUrgent(t, h, "urgent", request.ClassPriority); adm.Granted || !adm.MayPause {
		t.Fatalf("urgent: %+v, want queued, and a stream may be paused for it", adm)
	}
	if asked := h.rdb.HLen(t.Context(), h.prefix+"adm:{"+request.PoolShort+"}:asked").Val(); asked != 0 {
		t.Fatalf("%d streams asked to pause while flex was within its first tokens", asked)
	}
	for deadline := time.Now().Add(20 * time.Second); !slices.Contains(h.notifier.woken(), request.PoolShort+"/urgent"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("urgent was never granted")
		}
	}
	at := len(tokenTexts(t, h, "flex"))
	if at < 100 || at >= 300 {
		t.Fatalf("urgent granted when flex had %d of its 300 tokens, want paused past its first 100", at)
	}
	if _, err := h.gate.ReleaseAndWake(t.Context(), h.notifier, request.PoolShort, "urgent"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(tokenTexts(t, h, "flex")); n != 300 {
		t.Fatalf("flex streamed %d tokens, want its 300", n)
	}
}

// A stream is never paused for a request of its own class or a less
// urgent one, nor on a pool whose backend cannot continue an answer.
func TestStreamLLMNotPaused(t *testing.T) {
	for _, tc := range []struct {
		name, streamTier, waiterTier string
		continues                    bool
	}{
		{"priority stream", request.ClassPriority, request.ClassPriority, true},
		{"flex for flex", request.ClassFlex, request.ClassFlex, true},
		{"no continuation", request.ClassFlex, request.ClassPriority, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := pausingHarness(t, tc.continues)
			in := activities.LLMInput{RequestID: "s", Pool: request.PoolShort, Query: query, KB: kbName, MaxTokens: 120,
				ServiceTier: tc.streamTier, Weight: 1}
			done := make(chan error, 1)
			go func() {
				_, err := stream(t, h, in, nil)
				done <- err
			}()
			// Past the keep-alive's first offer (a second in).
			time.Sleep(1200 * time.Millisecond)
			if adm := admitUrgent(t, h, "w", tc.waiterTier); adm.Granted {
				t.Fatalf("w granted at once: %+v", adm)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if slices.Contains(h.notifier.woken(), request.PoolShort+"/w") {
				// Granted only by the stream's end is fine; by a pause is
				// not: the stream's tokens must all precede the grant.
				if held, _ := h.gate.Renew(t.Context(), request.PoolShort, "s"); held {
					t.Fatal("w was granted while s still held its permit")
				}
			}
			answered := 0
			for _, ev := range ofType(h.events(t, "s"), events.TypeToken) {
				if tok := decode[events.Token](t, ev); !tok.Notice {
					answered++
				}
			}
			if answered != 120 {
				t.Fatalf("s streamed %d tokens of its answer, want 120", answered)
			}
			key := h.prefix + "adm:{" + request.PoolShort + "}:asked"
			if n := h.rdb.HLen(t.Context(), key).Val(); n != 0 {
				t.Fatalf("%d pause requests recorded, want none", n)
			}
		})
	}
}

// A paused stream whose request is stopped while it waits ends as a
// stopped one does, with what it streamed for the bill, and gives back
// its queue place exactly once.
func TestStreamLLMStoppedWhilePaused(t *testing.T) {
	h := pausingHarness(t, true)
	done := make(chan error, 1)
	go func() {
		_, err := stream(t, h, activities.LLMInput{RequestID: "flex", Pool: request.PoolShort, Query: query, KB: kbName,
			MaxTokens: 400, ServiceTier: request.ClassFlex, Weight: 1}, nil)
		done <- err
	}()
	waitPausable(t, h, "flex")
	admitUrgent(t, h, "urgent", request.ClassPriority)
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(h.notifier.woken(), request.PoolShort+"/urgent"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("urgent was never granted the flex stream's permit")
		}
	}
	streamed := len(tokenTexts(t, h, "flex"))
	if _, err := local[struct{}](t, h, h.acts.StopStream, activities.StopStreamInput{RequestID: "flex"}); err != nil {
		t.Fatal(err)
	}
	err := <-done
	wantAppError(t, err, activities.ErrTypeCancelled, true)
	var usage events.Usage
	if err := appError(t, err).Details(&usage); err != nil || usage.CompletionTokens != streamed {
		t.Fatalf("stopped while paused: usage %+v (%v), want its %d tokens", usage, err, streamed)
	}
	rel, err := h.gate.Release(t.Context(), request.PoolShort, "flex")
	if err != nil || !rel.WasQueued || rel.HeldPermit {
		t.Fatalf("release of the paused request: %+v, %v; want its queue place back", rel, err)
	}
	if again, err := h.gate.Release(t.Context(), request.PoolShort, "flex"); err != nil || again.WasQueued || again.HeldPermit {
		t.Fatalf("second release: %+v, %v; want nothing", again, err)
	}
}

// A stream is offered for a pause only in the first half of its LLM
// activity's time (llm.timeout): a pause's wait counts against it.
func TestTooLateToPause(t *testing.T) {
	start := time.Unix(1000, 0)
	deadline := start.Add(5 * time.Minute)
	for _, tc := range []struct {
		name            string
		started, ending time.Time
		now             time.Time
		want            bool
	}{
		{"at the start", start, deadline, start, false},
		{"just before half", start, deadline, start.Add(150*time.Second - time.Millisecond), false},
		{"past half", start, deadline, start.Add(150*time.Second + time.Millisecond), true},
		{"no deadline", start, time.Time{}, start.Add(time.Hour), false},
	} {
		if got := activities.TooLateToPause(tc.started, tc.ending, tc.now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
