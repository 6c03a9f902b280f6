package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// The class a request is served in is echoed end to end: on Sluice's own
// stream by the accepted and done events, on the OpenAI endpoint by
// every chunk and by the completion, as the official client reads them;
// a class the plan does not grant is refused naming service_tier.
func TestServiceTierEchoedOnBothEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	s := chat(t, ctx, `{"query":"What is a leased semaphore?","max_tokens":8,"service_tier":"flex"}`)
	defer s.close()
	evs := s.until(t, terminal)
	var acc events.Accepted
	var done events.Done
	if evs[0].Event != events.TypeAccepted || evs[0].Decode(&acc) != nil || acc.ServiceTier != request.ClassFlex {
		t.Fatalf("first event %+v, want accepted in flex", evs[0])
	}
	if last := evs[len(evs)-1]; last.Event != events.TypeDone || last.Decode(&done) != nil || done.ServiceTier != request.ClassFlex {
		t.Fatalf("ended with %+v, want done in flex", last)
	}
	result(t, s.id)
	if in := chatInput(t, s.id); in.ServiceTier != request.ClassFlex || in.Settings.Weight != stack.cfg.Limits.Tiers["standard"].Classes[request.ClassFlex].Weight {
		t.Fatalf("workflow input class %q weight %d", in.ServiceTier, in.Settings.Weight)
	}

	client := openAIClient("k-acme")
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: "sluice-sim", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		MaxTokens: openai.Int(6), ServiceTier: openai.ChatCompletionNewParamsServiceTierFlex,
	})
	defer stream.Close()
	chunks, id := 0, ""
	for stream.Next() {
		id = stream.Current().ID
		if ch := stream.Current(); ch.ServiceTier != "flex" {
			t.Fatalf("chunk %d says service_tier %q: %s", chunks, ch.ServiceTier, ch.RawJSON())
		}
		chunks++
	}
	if err := stream.Err(); err != nil || chunks == 0 {
		t.Fatalf("stream of %d chunks: %v", chunks, err)
	}
	result(t, requestIDOf(t, id))

	c, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "sluice-sim", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(6),
	})
	if err != nil || c.ServiceTier != "default" {
		t.Fatalf("completion without service_tier: %v, service_tier %q", err, c.ServiceTier)
	}
	result(t, requestIDOf(t, c.ID))

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "sluice-sim", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		ServiceTier: openai.ChatCompletionNewParamsServiceTierPriority,
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "service_tier" || apiErr.Code != "service_tier_not_allowed" {
		t.Fatalf("priority on a plan without it: %v", err)
	}
	assertPoolsIdle(t)
}
