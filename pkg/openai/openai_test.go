package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// A chunk's usage has three forms on the wire, and each survives a round
// trip.
func TestOptionalUsage(t *testing.T) {
	cases := []struct {
		name  string
		usage Optional[Usage]
		want  string
	}{
		{"not asked for", Optional[Usage]{}, `{"id":"","object":"","created":0,"model":"","choices":[]}`},
		{"before the last chunk", Null[Usage](), `{"id":"","object":"","created":0,"model":"","choices":[],"usage":null}`},
		{"the last chunk", Of(Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}),
			`{"id":"","object":"","created":0,"model":"","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(Chunk{Choices: []ChunkChoice{}, Usage: tc.usage})
			if err != nil || string(raw) != tc.want {
				t.Fatalf("marshal: %s %v, want %s", raw, err, tc.want)
			}
			var back Chunk
			if err := json.Unmarshal(raw, &back); err != nil || !reflect.DeepEqual(back.Usage, tc.usage) {
				t.Fatalf("unmarshal: %+v %v, want %+v", back.Usage, err, tc.usage)
			}
		})
	}
}

// finish_reason is null, not absent, until the end; logprobs is sent only
// when set.
func TestChunkChoiceFormat(t *testing.T) {
	for _, tc := range []struct {
		choice ChunkChoice
		want   string
	}{
		{ChunkChoice{Delta: Delta{Role: "assistant", Content: ptr("")}},
			`{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}`},
		{ChunkChoice{Logprobs: Null[json.RawMessage](), FinishReason: ptr("stop")},
			`{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}`},
	} {
		raw, err := json.Marshal(tc.choice)
		if err != nil || string(raw) != tc.want {
			t.Errorf("%s %v, want %s", raw, err, tc.want)
		}
	}
}

func TestMessageParts(t *testing.T) {
	cases := []struct {
		content string
		want    []ContentPart
		err     bool
	}{
		{`"hi"`, []ContentPart{{Type: "text", Text: ptr("hi")}}, false},
		{`""`, []ContentPart{{Type: "text", Text: ptr("")}}, false},
		{`null`, nil, false},
		{``, nil, false},
		{`[]`, []ContentPart{}, false},
		{`[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x","detail":"low"}},{"type":"text"}]`,
			[]ContentPart{{Type: "text", Text: ptr("a")}, {Type: "image_url", ImageURL: &ImageURL{URL: "x", Detail: "low"}}, {Type: "text"}}, false},
		// A bare URL is read as one; another shape as an image of unknown
		// size, never a refusal.
		{`[{"type":"image_url","image_url":"x"},{"type":"image_url","image_url":[1]}]`,
			[]ContentPart{{Type: "image_url", ImageURL: &ImageURL{URL: "x"}}, {Type: "image_url", ImageURL: &ImageURL{}}}, false},
		{`42`, nil, true},
		{`{"text":"q"}`, nil, true},
		{`[1]`, nil, true},
	}
	for _, tc := range cases {
		got, err := Message{Role: "user", Content: json.RawMessage(tc.content)}.Parts()
		if (err != nil) != tc.err || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("content %s: %+v %v, want %+v (error %v)", tc.content, got, err, tc.want, tc.err)
		}
	}
}

// A request as the backend client writes it: no field it did not set.
func TestChatRequestEncoding(t *testing.T) {
	req := ChatRequest{
		Model: "m", Messages: []Message{TextMessage("user", `say "<hi>"`)}, MaxTokens: ptr(7),
		Stream: true, StreamOptions: &StreamOptions{IncludeUsage: true},
	}
	raw, err := json.Marshal(req)
	want := `{"model":"m","messages":[{"role":"user","content":"say \"\u003chi\u003e\""}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`
	if err != nil || string(raw) != want {
		t.Fatalf("%s %v, want %s", raw, err, want)
	}
	if parts, _ := req.Messages[0].Parts(); len(parts) != 1 || *parts[0].Text != `say "<hi>"` {
		t.Fatalf("text message reads back as %+v", parts)
	}
}

func TestChatRequestDecoding(t *testing.T) {
	var req ChatRequest
	body := `{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":12,"max_completion_tokens":30,
		"temperature":0.2,"stream":true,"stream_options":{"include_usage":true}}`
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	if *req.MaxOutputTokens() != 30 || !req.IncludeUsage() || req.N != nil {
		t.Fatalf("decoded %+v", req)
	}
	req.MaxCompletionTokens = nil
	if *req.MaxOutputTokens() != 12 {
		t.Fatalf("max_tokens alone: %d", *req.MaxOutputTokens())
	}
	req.MaxTokens, req.StreamOptions = nil, nil
	if req.MaxOutputTokens() != nil || req.IncludeUsage() {
		t.Fatalf("neither set: %+v", req)
	}
}

// A field sent as null is not set: a backend that refuses a parameter
// must not refuse a client that names it only to say "none".
func TestSamplingSetIgnoresNull(t *testing.T) {
	var s Sampling
	if err := json.Unmarshal([]byte(`{"tool_choice":null,"temperature":null,"stop":null,"seed":3}`), &s); err != nil {
		t.Fatal(err)
	}
	if got := s.Set(); !reflect.DeepEqual(got, []string{"seed"}) {
		t.Fatalf("set %v, want [seed]", got)
	}
	if mode, _, err := s.DecodeToolChoice(); err != nil || mode != ToolChoiceNone {
		t.Fatalf("tool choice %q %v", mode, err)
	}
}

// A decoded message encodes to the JSON it came from, fields this package
// does not declare included; a built one encodes its fields.
func TestMessageKeepsItsJSON(t *testing.T) {
	in := `{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"}}],"x_extra":{"a":1}}`
	var m Message
	if err := json.Unmarshal([]byte(in), &m); err != nil {
		t.Fatal(err)
	}
	if out, err := json.Marshal(m); err != nil || string(out) != in {
		t.Fatalf("re-encoded as %s %v", out, err)
	}
	if out, _ := json.Marshal(TextMessage("user", "hi")); string(out) != `{"role":"user","content":"hi"}` {
		t.Fatalf("built message encodes as %s", out)
	}
	call := `{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}`
	if err := json.Unmarshal([]byte(call), &m); err != nil || len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "f" {
		t.Fatalf("tool call message %+v %v", m, err)
	}
	if text, _ := m.Text(); text != "f{}" {
		t.Fatalf("text %q", text)
	}
}
