package integration

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/sluice-dev/sluice/pkg/request"
)

// requestIDOfResponse is the Sluice request behind a response id.
func requestIDOfResponse(t *testing.T, responseID string) string {
	t.Helper()
	ulid, ok := strings.CutPrefix(responseID, "resp_")
	if !ok || ulid == "" {
		t.Fatalf("response id %q is not resp_<ULID>", responseID)
	}
	return "chat-" + ulid
}

// The official Go client's Responses API, whole: the same workflow as a
// chat completion answers it, the input and instructions as its
// conversation, and the response says what the request used.
func TestOpenAIGoClientResponse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	r, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model:           stack.cfg.Pools.Short.Model,
		Instructions:    openai.String("Be brief."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Name a queueing discipline.")},
		MaxOutputTokens: openai.Int(24),
		Metadata:        map[string]string{"case": "plain"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.OutputText() == "" || r.Model != stack.cfg.Pools.Short.Model || r.Metadata["case"] != "plain" {
		t.Fatalf("response: text %q model %q metadata %v", r.OutputText(), r.Model, r.Metadata)
	}
	if r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens || r.Usage.OutputTokens < 1 {
		t.Fatalf("usage %+v", r.Usage)
	}
	id := requestIDOfResponse(t, r.ID)
	in := chatInput(t, id)
	if len(in.Conversation) != 2 || in.Conversation[0].Role != "system" || !in.Gateway || in.MaxTokens != 24 || in.Tenant != "acme" {
		t.Fatalf("workflow input %+v", in)
	}
	if res := result(t, id); res.Outcome != request.OutcomeDone || res.Usage.CompletionTokens != int(r.Usage.OutputTokens) {
		t.Fatalf("outcome %q usage %+v", res.Outcome, res.Usage)
	}
	assertPoolsIdle(t)
}

// Streamed, in RAG mode: every event numbered on from 0, the text deltas
// make the final response's text, and the client's accumulator takes
// every event.
func TestOpenAIGoClientStreamsAResponse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model:           "sluice-rag",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("How does a token bucket refill?")},
		MaxOutputTokens: openai.Int(30),
	})
	defer stream.Close()
	var acc responses.ResponseAccumulator
	var text strings.Builder
	var last responses.ResponseStreamEventUnion
	n := int64(0)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != n {
			t.Fatalf("event %d (%s) numbered %d", n, ev.Type, ev.SequenceNumber)
		}
		var server responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(ev.RawJSON()), &server); err != nil {
			t.Fatal(err)
		}
		if err := acc.AddEvent(server); err != nil {
			t.Fatalf("the accumulator refused %s: %v", ev.RawJSON(), err)
		}
		if ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
		last = ev
		n++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream after %d events: %v", n, err)
	}
	final, err := acc.ReconstructedResponse()
	if err != nil {
		t.Fatal(err)
	}
	if last.Type != "response.incomplete" && last.Type != "response.completed" {
		t.Fatalf("last event %s", last.Type)
	}
	if text.Len() == 0 || final.OutputText() != text.String() {
		t.Fatalf("deltas %q, final text %q", text.String(), final.OutputText())
	}
	id := requestIDOfResponse(t, final.ID)
	if in := chatInput(t, id); in.Gateway || in.Query != "How does a token bucket refill?" {
		t.Fatalf("workflow input %+v", in)
	}
	assertPoolsIdle(t)
}

// A response is stored by default: read back whole by its id, continued
// by previous_response_id (the next request's conversation holds the
// earlier input and answer), invisible to another tenant, and gone once
// deleted.
func TestOpenAIGoClientStoredResponses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	first, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: stack.cfg.Pools.Short.Model, Instructions: openai.String("Be brief."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Name a queueing discipline.")},
		MaxOutputTokens: openai.Int(16),
	})
	if err != nil {
		t.Fatal(err)
	}
	var got *responses.Response
	// The workflow stores the answer just after the client has it; until
	// then the read is the event log's, whole as well.
	if got, err = client.Responses.Get(ctx, first.ID, responses.ResponseGetParams{}); err != nil {
		t.Fatal(err)
	}
	if got.OutputText() != first.OutputText() || got.Status != first.Status || got.Usage.TotalTokens != first.Usage.TotalTokens {
		t.Fatalf("read back: %q %s %+v; created %q %s %+v", got.OutputText(), got.Status, got.Usage, first.OutputText(), first.Status, first.Usage)
	}
	second, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: stack.cfg.Pools.Short.Model, PreviousResponseID: openai.String(first.ID),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("And another?")},
		MaxOutputTokens: openai.Int(16),
	})
	if err != nil {
		t.Fatal(err)
	}
	in := chatInput(t, requestIDOfResponse(t, second.ID))
	if len(in.Conversation) != 3 || in.Conversation[0].Role != "user" || in.Conversation[1].Role != "assistant" || in.Conversation[2].Role != "user" {
		t.Fatalf("the continued conversation: %+v", in.Conversation)
	}
	if text, _ := in.Conversation[1].Text(); text != first.OutputText() {
		t.Fatalf("the continued conversation's answer %q, want the first response's %q", text, first.OutputText())
	}
	recordHistory(t, requestIDOfResponse(t, second.ID), "chat_response_stored")

	// A response's own input items, a page at a time.
	three, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: stack.cfg.Pools.Short.Model, MaxOutputTokens: openai.Int(4),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("one", responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfMessage("two", responses.EasyInputMessageRoleAssistant),
			responses.ResponseInputItemParamOfMessage("three", responses.EasyInputMessageRoleUser),
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	pages := 0
	page, err := client.Responses.InputItems.List(ctx, three.ID, responses.InputItemListParams{Limit: openai.Int(2), Order: responses.InputItemListParamsOrderAsc})
	for ; err == nil && page != nil; page, err = page.GetNextPage() {
		pages++
		for _, it := range page.Data {
			var m struct {
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			}
			if json.Unmarshal([]byte(it.RawJSON()), &m) != nil || len(m.Content) == 0 || it.ID == "" {
				t.Fatalf("input item %s", it.RawJSON())
			}
			texts = append(texts, m.Content[0].Text)
		}
	}
	if err != nil || pages != 2 || strings.Join(texts, " ") != "one two three" {
		t.Fatalf("input items %v over %d pages (%v), want one two three over 2", texts, pages, err)
	}

	var apiErr *openai.Error
	other := openAIClient("k-slow")
	if _, err := other.Responses.Get(ctx, first.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("another tenant reads the response: %v", err)
	}
	if _, err := other.Responses.New(ctx, responses.ResponseNewParams{Model: stack.cfg.Pools.Short.Model,
		PreviousResponseID: openai.String(first.ID), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}); !errors.As(err, &apiErr) ||
		apiErr.StatusCode != 404 || apiErr.Param != "previous_response_id" {
		t.Fatalf("another tenant continues the response: %v", err)
	}
	if err := client.Responses.Delete(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Responses.Get(ctx, first.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("a deleted response is read: %v", err)
	}
	assertPoolsIdle(t)
}
