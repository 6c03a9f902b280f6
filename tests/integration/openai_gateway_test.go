package integration

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/sluice-dev/sluice/pkg/request"
)

var weatherTool = openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
	Name:        "get_weather",
	Description: openai.String("The weather in a city now."),
	Parameters: openai.FunctionParameters{
		"type":       "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}},
		"required":   []string{"city"},
	},
})

// The official Go client, unchanged, gets a tool call streamed in pieces
// through the whole pipeline (limits, admission, workflow, events), then
// an answer to the tool's result.
func TestOpenAIGoClientToolCall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	question := openai.UserMessage("What is the weather in Paris?")
	params := openai.ChatCompletionNewParams{
		Model: stack.cfg.Pools.Short.Model, Messages: []openai.ChatCompletionMessageParamUnion{question},
		Tools: []openai.ChatCompletionToolUnionParam{weatherTool},
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	var finished []openai.FinishedChatCompletionToolCall
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("the accumulator refused %s", stream.Current().RawJSON())
		}
		if call, ok := acc.JustFinishedToolCall(); ok {
			finished = append(finished, call)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "tool_calls" || acc.Model != stack.cfg.Pools.Short.Model {
		t.Fatalf("accumulated %+v", acc.ChatCompletion)
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 1 || len(finished) != 1 || finished[0].Name != "get_weather" || calls[0].ID == "" {
		t.Fatalf("tool calls %+v, finished %+v", calls, finished)
	}
	var args struct{ City string }
	if err := json.Unmarshal([]byte(calls[0].Function.Arguments), &args); err != nil || args.City == "" {
		t.Fatalf("arguments %q: %v", calls[0].Function.Arguments, err)
	}
	id := requestIDOf(t, acc.ID)
	if in := chatInput(t, id); !in.Gateway || in.Sampling == nil || len(in.Sampling.Tools) != 1 || in.KB != "" {
		t.Fatalf("workflow input %+v", in)
	}
	if r := result(t, id); r.Outcome != request.OutcomeDone || r.FinishReason != "tool_calls" {
		t.Fatalf("result %+v", r)
	}
	recordHistory(t, id, "chat_gateway_tool_call")

	// The tool's result goes back in the conversation; the model answers.
	params.Messages = append(params.Messages, acc.Choices[0].Message.ToParam(),
		openai.ToolMessage(`{"temp_c":18,"sky":"clear"}`, calls[0].ID))
	params.MaxTokens = openai.Int(24)
	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if fr := c.Choices[0].FinishReason; (fr != "stop" && fr != "length") || strings.TrimSpace(c.Choices[0].Message.Content) == "" {
		t.Fatalf("answer to the tool result %s", c.RawJSON())
	}
	answerID := requestIDOf(t, c.ID)
	if in := chatInput(t, answerID); len(in.Conversation) != 3 || in.Conversation[2].ToolCallID != calls[0].ID {
		t.Fatalf("conversation forwarded %+v", in.Conversation)
	}
	if r := result(t, answerID); r.Outcome != request.OutcomeDone {
		t.Fatalf("outcome %q", r.Outcome)
	}
	assertPoolsIdle(t)
}

// Embeddings through the official client: the embedder Sluice retrieves
// with, through its cache tier.
func TestOpenAIGoClientEmbeddings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := openAIClient("k-acme")
	res, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: stack.cfg.Embedding.Model,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"token bucket", "leaky bucket"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Data) != 2 || len(res.Data[0].Embedding) == 0 || len(res.Data[0].Embedding) != len(res.Data[1].Embedding) || res.Usage.PromptTokens == 0 {
		t.Fatalf("embeddings %s", res.RawJSON())
	}
	// base64, as the JavaScript client asks by default, decodes to the
	// same vector.
	b64, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: stack.cfg.Embedding.Model, Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("token bucket")},
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatBase64,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(b64.Data) != 1 || !strings.HasPrefix(b64.Data[0].JSON.Embedding.Raw(), `"`) {
		t.Fatalf("base64 embedding %s", b64.RawJSON())
	}
	_, err = client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "text-embedding-3-small", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("another model: %v", err)
	}
}

// Several answers (n) come back as several choices, streamed and not,
// each whole and ended with its own finish reason.
func TestOpenAIGoClientSeveralChoices(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	params := openai.ChatCompletionNewParams{
		Model: stack.cfg.Pools.Short.Model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Name a queueing discipline.")},
		N: openai.Int(3), MaxTokens: openai.Int(12), Seed: openai.Int(1),
	}
	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 3 || c.Choices[0].Message.Content == c.Choices[1].Message.Content {
		t.Fatalf("completion %s", c.RawJSON())
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("the accumulator refused %s", stream.Current().RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 3 {
		t.Fatalf("%d choices streamed", len(acc.Choices))
	}
	for i, ch := range acc.Choices {
		// The same seed and prompt: the streamed answers are the ones
		// answered whole.
		if ch.Index != int64(i) || ch.Message.Content != c.Choices[i].Message.Content || ch.FinishReason != c.Choices[i].FinishReason {
			t.Fatalf("choice %d streamed %+v, answered %+v", i, ch, c.Choices[i])
		}
	}
	// The client has its answers before the workflows give their permits
	// back.
	for _, id := range []string{c.ID, acc.ID} {
		if r := result(t, requestIDOf(t, id)); r.Outcome != request.OutcomeDone {
			t.Fatalf("outcome %q", r.Outcome)
		}
	}
	assertPoolsIdle(t)
}

// A json_object answer cut at max_tokens reaches an OpenAI client as the
// backend sent it, byte for byte, streamed and not: finish_reason "length"
// says it was cut, and nothing is added to the content (the native API's
// truncation notice would break a client parsing it).
func TestOpenAIGoClientCutJSONIsTheBackends(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Model:    stack.cfg.Pools.Short.Model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Reply in JSON: what does a token bucket do?")},
		// The simulator's answers here are 150 tokens or more: cut.
		MaxTokens:      openai.Int(9),
		Seed:           openai.Int(11),
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &openai.ResponseFormatJSONObjectParam{}},
	}
	backend := openai.NewClient(option.WithBaseURL(stack.simURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	sent, err := backend.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	want := sent.Choices[0].Message.Content
	if sent.Choices[0].FinishReason != "length" || !strings.HasPrefix(want, "{") || json.Valid([]byte(want)) {
		t.Fatalf("the simulator's answer %q (%s) is not JSON cut short", want, sent.Choices[0].FinishReason)
	}
	if streamed := accumulate(t, backend.Chat.Completions.NewStreaming(ctx, params)); streamed.Choices[0].Message.Content != want {
		t.Fatalf("the simulator streams %q, answers %q", streamed.Choices[0].Message.Content, want)
	}

	client := openAIClient("k-acme")
	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Choices[0]; got.Message.Content != want || got.FinishReason != "length" {
		t.Fatalf("Sluice answered %q (%s), the backend sent %q", got.Message.Content, got.FinishReason, want)
	}
	acc := accumulate(t, client.Chat.Completions.NewStreaming(ctx, params))
	if got := acc.Choices[0]; got.Message.Content != want || got.FinishReason != "length" {
		t.Fatalf("Sluice streamed %q (%s), the backend sent %q", got.Message.Content, got.FinishReason, want)
	}
	for _, id := range []string{c.ID, acc.ID} {
		if r := result(t, requestIDOf(t, id)); r.Outcome != request.OutcomeDone {
			t.Fatalf("outcome %q", r.Outcome)
		}
	}
	assertPoolsIdle(t)
}

// accumulate reads a stream of one choice with the official client's
// accumulator.
func accumulate(t *testing.T, stream *ssestream.Stream[openai.ChatCompletionChunk]) openai.ChatCompletionAccumulator {
	t.Helper()
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("the accumulator refused %s", stream.Current().RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 {
		t.Fatalf("%d choices streamed", len(acc.Choices))
	}
	return acc
}
