package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
)

// backgroundResponse creates a background response of the short pool's
// model that answers n tokens.
func backgroundResponse(t *testing.T, ctx context.Context, client openai.Client, n int) *responses.Response {
	t.Helper()
	r, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model:           stack.cfg.Pools.Short.Model,
		Background:      openai.Bool(true),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(llmsim.AnswerTokensDirective(n) + "Explain weighted fair queuing.")},
		MaxOutputTokens: openai.Int(int64(n)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != responses.ResponseStatusQueued || !r.Background || len(r.Output) != 0 {
		t.Fatalf("created %s background %v with %d items, want queued and empty", r.Status, r.Background, len(r.Output))
	}
	return r
}

// awaitStatus reads response id until its status is one of want.
func awaitStatus(t *testing.T, ctx context.Context, client openai.Client, id string, want ...responses.ResponseStatus) *responses.Response {
	t.Helper()
	for {
		r, err := client.Responses.Get(ctx, id, responses.ResponseGetParams{})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if r.Status == w {
				return r
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("response %s is %s, want one of %v", id, r.Status, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// A background response answers at once (queued) and runs to its end
// with no client: the one that streamed it went away after its first
// token, and the whole answer is read back afterwards.
func TestBackgroundResponseRunsWithNoClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	const n = 120
	r := backgroundResponse(t, ctx, client, n)
	id := requestIDOfResponse(t, r.ID)
	if in := chatInput(t, id); !in.Background || in.Tenant != "acme" {
		t.Fatalf("workflow input: background %v tenant %q", in.Background, in.Tenant)
	}

	// A reader comes and goes after its first delta.
	rctx, leave := context.WithCancel(ctx)
	stream := client.Responses.GetStreaming(rctx, r.ID, responses.ResponseGetParams{})
	read := false
	for !read && stream.Next() {
		read = stream.Current().Type == "response.output_text.delta"
	}
	if err := stream.Err(); err != nil || !read {
		t.Fatalf("the reader saw no delta: %v", err)
	}
	leave()
	_ = stream.Close()

	done := awaitStatus(t, ctx, client, r.ID, responses.ResponseStatusCompleted, responses.ResponseStatusIncomplete, responses.ResponseStatusFailed)
	if done.Usage.OutputTokens != n || done.OutputText() == "" {
		t.Fatalf("read back %s with %d output tokens (%q), want all %d", done.Status, done.Usage.OutputTokens, done.OutputText(), n)
	}
	if res := result(t, id); res.Outcome != request.OutcomeDone {
		t.Fatalf("outcome %q", res.Outcome)
	}
	recordHistory(t, id, "chat_background")
	assertPoolsIdle(t)
}

// A stream read again from starting_after=N is exactly the events after
// N of the whole stream, on this replica as on any: the events are
// numbered from the request's log alone.
func TestBackgroundResponseStreamsAgainFromAnyEvent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	r := backgroundResponse(t, ctx, client, 24)
	read := func(params responses.ResponseGetParams) []string {
		t.Helper()
		stream := client.Responses.GetStreaming(ctx, r.ID, params)
		defer stream.Close()
		var evs []string
		for stream.Next() {
			evs = append(evs, stream.Current().RawJSON())
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream after %d events: %v", len(evs), err)
		}
		return evs
	}
	// The first read follows the response live, from its start.
	all := read(responses.ResponseGetParams{})
	if len(all) < 8 {
		t.Fatalf("%d events", len(all))
	}
	for i, raw := range all {
		var ev responses.ResponseStreamEventUnion
		if err := ev.UnmarshalJSON([]byte(raw)); err != nil || ev.SequenceNumber != int64(i) {
			t.Fatalf("event %d: %s (%v)", i, raw, err)
		}
	}
	for _, after := range []int{0, len(all) / 2, len(all) - 2, len(all) - 1} {
		got := read(responses.ResponseGetParams{StartingAfter: openai.Int(int64(after))})
		want := all[after+1:]
		if len(got) != len(want) {
			t.Fatalf("starting after %d: %d events, want %d", after, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("starting after %d, event %d:\n%s\nwant\n%s", after, after+1+i, got[i], want[i])
			}
		}
	}
	var apiErr *openai.Error
	other := openAIClient("k-slow")
	if _, err := other.Responses.Get(ctx, r.ID, responses.ResponseGetParams{StartingAfter: openai.Int(1)}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("another tenant streams the response: %v", err)
	}
	assertPoolsIdle(t)
}

// Cancel stops a background response mid-answer: its model call ends,
// its permit goes back, and it reads cancelled with what it had said.
// Only a background response can be cancelled; one that ended is
// answered as it is.
func TestCancelABackgroundResponse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	r := backgroundResponse(t, ctx, client, 1000)
	awaitStatus(t, ctx, client, r.ID, responses.ResponseStatusInProgress)
	for {
		// In progress once its stream began; cancel once it has said
		// something.
		got, err := client.Responses.Get(ctx, r.ID, responses.ResponseGetParams{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Output) > 0 || got.Status != responses.ResponseStatusInProgress {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	got, err := client.Responses.Cancel(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != responses.ResponseStatusCancelled {
		t.Fatalf("cancelled response reads %s with %d output tokens", got.Status, got.Usage.OutputTokens)
	}
	id := requestIDOfResponse(t, r.ID)
	if res := result(t, id); res.Outcome != request.OutcomeCancelled || res.Usage.CompletionTokens >= 1000 {
		t.Fatalf("outcome %q after %d completion tokens", res.Outcome, res.Usage.CompletionTokens)
	}
	assertPoolsIdle(t)
	deadline := time.Now().Add(5 * time.Second)
	for stack.sim.Stats().Running != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the simulator still runs %d sequences after the cancel", stack.sim.Stats().Running)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stored := awaitStatus(t, ctx, client, r.ID, responses.ResponseStatusCancelled)
	if stored.OutputText() == "" || stored.OutputText() != got.OutputText() {
		t.Fatalf("stored cancelled with %q; the cancel answered %q: want what was said before it", stored.OutputText(), got.OutputText())
	}
	// Ended: answered as it is.
	if again, err := client.Responses.Cancel(ctx, r.ID); err != nil || again.Status != responses.ResponseStatusCancelled {
		t.Fatalf("cancel again: %v %v", again, err)
	}

	var apiErr *openai.Error
	attached, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: stack.cfg.Pools.Short.Model, MaxOutputTokens: openai.Int(4),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Responses.Cancel(ctx, attached.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
		t.Fatalf("cancel a response not in the background: %v", err)
	}
	other := openAIClient("k-slow")
	if _, err := other.Responses.Cancel(ctx, r.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("another tenant cancels the response: %v", err)
	}
}
