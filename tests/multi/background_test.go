package multi

import (
	"context"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/sluice-dev/sluice/pkg/llmsim"
)

// openAIOn is the official Go client on api's OpenAI routes, as key.
func openAIOn(api *apiProc, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(api.url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// readResponseEvents reads a response's stream until its end, or until
// it has read stopAfter text deltas (< 0: to its end). It returns the
// sequence number of the last event read, the deltas and the last event's
// type.
func readResponseEvents(t *testing.T, stream interface {
	Next() bool
	Current() responses.ResponseStreamEventUnion
	Err() error
}, from int64, stopAfter int) (last int64, deltas []string, end string) {
	t.Helper()
	last = from - 1
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != last+1 {
			t.Fatalf("event %s numbered %d after %d", ev.Type, ev.SequenceNumber, last)
		}
		last, end = ev.SequenceNumber, ev.Type
		if ev.Type == "response.output_text.delta" {
			deltas = append(deltas, ev.Delta)
			if len(deltas) == stopAfter {
				return last, deltas, end
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream after event %d: %v", last, err)
	}
	return last, deltas, end
}

// TestBackgroundResponseSurvivesKills creates a background response
// through API 1 and follows it through API 2. Mid-answer, API 1 and both
// workers (the one streaming it among them) are killed with SIGKILL; the
// workers start again 2 s later. The response still completes, and the
// stream read again through API 2 from the last event its reader had
// gives every remaining token once: the reader's deltas are the whole
// answer, as long as it was asked, and as stored.
func TestBackgroundResponseSurvivesKills(t *testing.T) {
	s := stackFor(t)
	api1, api2 := s.apis[0], s.apis[1]
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, w := range s.workers {
			if !w.Running() {
				if err := w.Start(); err != nil {
					t.Errorf("restart %s: %v", w.Name, err)
				}
			}
		}
		if !api1.Running() {
			if err := s.restartAPI(ctx, api1); err != nil {
				t.Errorf("restart %s: %v", api1.Name, err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := nextKey()
	const n = 400
	c1 := openAIOn(api1, key)
	created, err := c1.Responses.New(ctx, responses.ResponseNewParams{
		Model:           s.cfg.Pools.Short.Model,
		Background:      openai.Bool(true),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(llmsim.AnswerTokensDirective(n) + "Explain fair queuing.")},
		MaxOutputTokens: openai.Int(n + 100),
	})
	if err != nil {
		t.Fatalf("create through %s: %v", api1.Name, err)
	}
	if created.Status != responses.ResponseStatusQueued {
		t.Fatalf("created %s, want queued", created.Status)
	}
	c2 := openAIOn(api2, key)
	rctx, leave := context.WithCancel(ctx)
	first := c2.Responses.GetStreaming(rctx, created.ID, responses.ResponseGetParams{})
	last, deltas, end := readResponseEvents(t, first, 0, 20)
	leave()
	_ = first.Close()
	if len(deltas) < 20 || end != "response.output_text.delta" {
		t.Fatalf("read %d deltas through %s, ending %s: want 20 mid-answer", len(deltas), api2.Name, end)
	}

	if err := api1.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, w := range s.workers {
		if err := w.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s: %d tokens read (event %d), then %s and both workers killed", created.ID, len(deltas), last, api1.Name)
	time.Sleep(2 * time.Second)
	for _, w := range s.workers {
		if err := w.Start(); err != nil {
			t.Fatalf("restart %s: %v", w.Name, err)
		}
	}

	again := c2.Responses.GetStreaming(ctx, created.ID, responses.ResponseGetParams{StartingAfter: openai.Int(last)})
	_, rest, end := readResponseEvents(t, again, last+1, -1)
	_ = again.Close()
	deltas = append(deltas, rest...)
	if end != "response.completed" || len(deltas) != n {
		t.Fatalf("read on through %s: %d deltas in all, ending %s; want %d, completed", api2.Name, len(deltas), end, n)
	}
	var text string
	for _, d := range deltas {
		text += d
	}
	for {
		got, err := c2.Responses.Get(ctx, created.ID, responses.ResponseGetParams{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status == responses.ResponseStatusCompleted {
			if got.OutputText() != text || got.Usage.OutputTokens != n {
				t.Fatalf("stored %d output tokens, text %d bytes; the reader had %d deltas, %d bytes", got.Usage.OutputTokens, len(got.OutputText()), n, len(text))
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("response %s still %s", created.ID, got.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkSettled(t, s, tenant)
}
