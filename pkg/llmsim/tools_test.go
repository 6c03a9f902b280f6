package llmsim_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/sluice-dev/sluice/pkg/openai"
)

const weatherQuestion = "What is the weather in Lisbon tomorrow?"

// weatherTools are two functions; the first requires two of its three
// parameters, the second requires none.
func weatherTools() []map[string]any {
	return []map[string]any{
		{"type": "function", "function": map[string]any{
			"name": "get_weather",
			"parameters": map[string]any{
				"type": "object",
				"properties": map[string]any{
					"location": map[string]any{"type": "string"},
					"unit":     map[string]any{"type": "string", "enum": []string{"celsius", "fahrenheit"}},
					"days":     map[string]any{"type": "integer"},
				},
				"required": []string{"location", "unit"},
			},
		}},
		{"type": "function", "function": map[string]any{
			"name": "get_time",
			"parameters": map[string]any{
				"type":       "object",
				"properties": map[string]any{"zone": map[string]any{"type": "string"}, "utc": map[string]any{"type": "boolean"}},
			},
		}},
	}
}

func toolRequest() map[string]any {
	return map[string]any{"model": "tool-model", "messages": userMsg(weatherQuestion), "tools": weatherTools()}
}

// checkWeatherArgs checks get_weather's arguments: the required
// properties only, the location a word of the question.
func checkWeatherArgs(t *testing.T, args string) {
	t.Helper()
	var got map[string]any
	if err := json.Unmarshal([]byte(args), &got); err != nil {
		t.Fatalf("arguments %q are not JSON: %v", args, err)
	}
	loc, _ := got["location"].(string)
	if len(got) != 2 || got["unit"] != "celsius" || loc == "" || !strings.Contains(strings.ToLower(weatherQuestion), loc) {
		t.Errorf("arguments = %s, want location (a word of the question) and unit celsius", args)
	}
}

func TestToolCallStreamed(t *testing.T) {
	sim := start(t, testConfig())
	chunks := sim.chunks(t, toolRequest())
	if len(chunks) < 5 {
		t.Fatalf("got %d chunks, want opening, argument pieces, finish, usage", len(chunks))
	}
	first := chunks[0].Choices[0].Delta
	if first.Role != "assistant" || first.Content != nil || len(first.ToolCalls) != 1 {
		t.Fatalf("opening delta = %+v, want role assistant and one tool call", first)
	}
	if tc := first.ToolCalls[0]; tc.Index != 0 || !strings.HasPrefix(tc.ID, "call_") || tc.Type != "function" ||
		tc.Function.Name != "get_weather" || tc.Function.Arguments != "" {
		t.Errorf("opening tool call = %+v, want index 0, call_ id, function get_weather, no arguments", tc)
	}
	var calls []openai.ToolCall
	index := map[int]int{}
	pieces, finish := 0, ""
	var u openai.Usage
	for i, c := range chunks {
		if c.Model != "tool-model" {
			t.Errorf("chunk %d model %q, want the request's", i, c.Model)
		}
		if c.Usage.Value != nil {
			u = *c.Usage.Value
		}
		if len(c.Choices) == 0 {
			continue
		}
		ch := c.Choices[0]
		if ch.Delta.Content != nil {
			t.Errorf("chunk %d has content %q", i, *ch.Delta.Content)
		}
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
		if i > 0 && len(ch.Delta.ToolCalls) > 0 {
			pieces++
		}
		calls = openai.AddToolCalls(calls, index, ch.Delta.ToolCalls)
	}
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" || finish != "tool_calls" {
		t.Fatalf("calls %+v, finish %q; want one get_weather call, tool_calls", calls, finish)
	}
	checkWeatherArgs(t, calls[0].Function.Arguments)
	if pieces < 3 || u.CompletionTokens != pieces+1 {
		t.Errorf("%d argument pieces, usage %+v; want several pieces, one token each plus the call's name", pieces, u)
	}

	// Not streamed, the same call.
	c, raw := sim.completion(t, toolRequest())
	m := c.Choices[0].Message
	if !strings.Contains(raw, `"content":null`) || m.Content != nil || len(m.ToolCalls) != 1 || c.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("completion = %s, want content null, one tool call, finish tool_calls", raw)
	}
	if m.ToolCalls[0] != calls[0] || c.Usage != u || c.Model != "tool-model" {
		t.Errorf("completion call %+v usage %+v, want the streamed %+v %+v", m.ToolCalls[0], c.Usage, calls[0], u)
	}
}

func TestToolChoice(t *testing.T) {
	sim := start(t, testConfig())
	body := toolRequest()
	body["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": "get_time"}}
	c, _ := sim.completion(t, body)
	calls := c.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].Function.Name != "get_time" {
		t.Fatalf("tool calls %+v, want get_time", calls)
	}
	// With nothing required, every property is filled.
	var args map[string]any
	if err := json.Unmarshal([]byte(calls[0].Function.Arguments), &args); err != nil || args["utc"] != true || args["zone"] == nil {
		t.Errorf("arguments %q (%v), want zone and utc", calls[0].Function.Arguments, err)
	}

	body["tool_choice"] = "required"
	if c, _ := sim.completion(t, body); c.Choices[0].Message.ToolCalls[0].Function.Name != "get_weather" {
		t.Errorf("tool_choice required called %+v, want the first tool", c.Choices[0].Message.ToolCalls)
	}
	body["tool_choice"] = "none"
	c, _ = sim.completion(t, body)
	if len(c.Choices[0].Message.ToolCalls) != 0 || text(c) == "" || c.Choices[0].FinishReason != "stop" {
		t.Errorf("tool_choice none: %+v, want a text answer", c.Choices[0])
	}
	// A call cut by max_tokens ends with length, its arguments unfinished.
	body["tool_choice"], body["max_tokens"] = "auto", 3
	c, _ = sim.completion(t, body)
	if fr := c.Choices[0].FinishReason; fr != "length" || c.Usage.CompletionTokens != 3 || json.Valid([]byte(c.Choices[0].Message.ToolCalls[0].Function.Arguments)) {
		t.Errorf("cut call: %+v %+v, want finish length and unfinished arguments", c.Choices[0], c.Usage)
	}
}

func TestToolResultGetsText(t *testing.T) {
	sim := start(t, testConfig())
	call, _ := sim.completion(t, toolRequest())
	tc := call.Choices[0].Message.ToolCalls[0]
	body := toolRequest()
	body["messages"] = []map[string]any{
		{"role": "user", "content": weatherQuestion},
		{"role": "assistant", "content": nil, "tool_calls": []openai.ToolCall{tc}},
		{"role": "tool", "tool_call_id": tc.ID, "content": "Sunny and mild, twenty degrees, light breeze from the ocean"},
	}
	c, _ := sim.completion(t, body)
	answer := strings.ToLower(text(c))
	if len(c.Choices[0].Message.ToolCalls) != 0 || c.Choices[0].FinishReason != "stop" || answer == "" {
		t.Fatalf("after the tool result: %+v, want a text answer", c.Choices[0])
	}
	used := false
	for _, w := range []string{"sunny", "mild", "twenty", "degrees", "light", "breeze", "ocean"} {
		used = used || strings.Contains(answer, w)
	}
	if !used {
		t.Errorf("answer %q uses no word of the tool result", answer)
	}
	toks, finish, u := streamTokens(t, sim.chunks(t, body))
	if strings.Join(toks, "") != text(c) || finish != "stop" || u != c.Usage {
		t.Errorf("streamed %q %s %+v, want the completion's answer", strings.Join(toks, ""), finish, u)
	}
}

// openai-go's accumulator must take the streamed call as it takes
// OpenAI's, and tell when the call is complete.
func TestToolCallWithOpenAIClient(t *testing.T) {
	sim := start(t, testConfig())
	client := oai.NewClient(option.WithBaseURL(sim.url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	params := oai.ChatCompletionNewParams{
		Model:    "tool-model",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage(weatherQuestion)},
		Tools: []oai.ChatCompletionToolUnionParam{oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:       "get_weather",
			Parameters: shared.FunctionParameters(weatherTools()[0]["function"].(map[string]any)["parameters"].(map[string]any)),
		})},
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)},
	}
	ctx := context.Background()
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc oai.ChatCompletionAccumulator
	var finished []oai.FinishedChatCompletionToolCall
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("accumulator refused chunk %s", stream.Current().RawJSON())
		}
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished = append(finished, tc)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(finished) != 1 || finished[0].Name != "get_weather" || !strings.HasPrefix(finished[0].ID, "call_") {
		t.Fatalf("finished tool calls %+v, want one get_weather call", finished)
	}
	checkWeatherArgs(t, finished[0].Arguments)
	if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "tool_calls" || acc.Usage.CompletionTokens < 4 {
		t.Errorf("accumulated %+v usage %+v", acc.Choices, acc.Usage)
	}

	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if calls := c.Choices[0].Message.ToolCalls; len(calls) != 1 || calls[0].Function.Arguments != finished[0].Arguments ||
		calls[0].ID != finished[0].ID || c.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("completion %+v, want the streamed call", c.Choices[0])
	}
}
