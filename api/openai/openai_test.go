package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

func TestParseCompletionRequest(t *testing.T) {
	cases := []struct {
		name, body, header string
		query, kb, model   string
		gateway            bool
		maxTokens          int // 0: unset
		stream, usage      bool
		sampling           []string
		mediaParts         int
	}{
		{name: "gateway", body: `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
			model: "gpt-4o", gateway: true},
		{name: "gateway keeps the whole conversation", body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"first"},
			{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
			{"role":"tool","tool_call_id":"c1","content":"42"},{"role":"developer","content":"x"}]}`,
			model: "m", gateway: true},
		{name: "gateway image part", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}}]}]}`,
			model: "m", gateway: true, mediaParts: 1},
		{name: "rag alias", body: `{"model":"sluice-rag","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			query: "a\nb", model: "sluice-rag"},
		{name: "rag alias names the kb", body: `{"model":"sluice-rag/docs","messages":[{"role":"user","content":"q"}]}`,
			query: "q", kb: "docs", model: "sluice-rag/docs"},
		{name: "rag: the last user message is the query", body: `{"model":"m","kb":"docs","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"first"},
			{"role":"assistant","content":"an answer"},{"role":"developer","content":"x"},{"role":"user","content":"second"}]}`,
			query: "second", kb: "docs", model: "m"},
		{name: "rag: a trailing assistant message", body: `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"prefill"}]}`,
			header: "hdr", query: "q", kb: "hdr", model: "m"},
		{name: "forwarded and accepted fields", body: `{"model":"m","messages":[{"role":"user","content":"q","name":"bob"}],"temperature":0.2,"top_p":1,
			"n":1,"user":"u1","seed":7,"stop":"x","presence_penalty":0,"frequency_penalty":0,"logit_bias":{"50256":-100},"store":false,"logprobs":false,
			"response_format":{"type":"json_object"},"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto",
			"parallel_tool_calls":false,"metadata":null,"stream":true,"stream_options":{"include_usage":true}}`,
			model: "m", gateway: true, stream: true, usage: true,
			sampling: []string{"temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls"}},
		{name: "max_tokens", body: `{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":12}`,
			model: "m", gateway: true, maxTokens: 12},
		{name: "max_completion_tokens wins", body: `{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":12,"max_completion_tokens":30}`,
			model: "m", gateway: true, maxTokens: 30},
		{name: "kb field beats the header", body: `{"model":"m","messages":[{"role":"user","content":"q"}],"kb":"docs"}`, header: "other",
			query: "q", kb: "docs", model: "m"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cr, req, err := parseCompletionRequest([]byte(tc.body), tc.header)
			if err != nil {
				t.Fatal(err)
			}
			if req.Query != tc.query || req.KB != tc.kb || cr.Model != tc.model || req.Gateway != tc.gateway || cr.Stream != tc.stream || cr.IncludeUsage() != tc.usage {
				t.Fatalf("parsed %+v / %+v", cr, req)
			}
			if len(req.Conversation) != len(cr.Messages) || req.MediaParts != tc.mediaParts {
				t.Fatalf("conversation of %d messages, %d media parts", len(req.Conversation), req.MediaParts)
			}
			var got []string
			if req.Sampling != nil {
				got = req.Sampling.Set()
			}
			if (req.Sampling == nil) != (tc.sampling == nil) || strings.Join(got, ",") != strings.Join(tc.sampling, ",") {
				t.Fatalf("sampling %v, want %v", got, tc.sampling)
			}
			if (tc.maxTokens == 0) != (req.MaxTokens == nil) || (req.MaxTokens != nil && *req.MaxTokens != tc.maxTokens) {
				t.Fatalf("max tokens %v, want %d", req.MaxTokens, tc.maxTokens)
			}
		})
	}
}

func TestParseCompletionRequestRefusals(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"q"}]`
	cases := []struct{ name, body, code, param string }{
		{"malformed", `{"messages":[`, "bad_json", ""},
		{"wrong type", `{"messages":"hi"}`, "bad_json", ""},
		{"n above the cap", `{"model":"m",` + msgs + `,"n":9}`, "invalid_value", "n"},
		{"unknown field", `{"model":"m",` + msgs + `,"some_future_field":{"x":[1]}}`, "unsupported_parameter", "some_future_field"},
		{"logprobs", `{"model":"m",` + msgs + `,"logprobs":true}`, "unsupported_parameter", "logprobs"},
		{"metadata", `{"model":"m",` + msgs + `,"metadata":{"a":"b"}}`, "unsupported_parameter", "metadata"},
		{"temperature out of range", `{"model":"m",` + msgs + `,"temperature":2.5}`, "invalid_value", "temperature"},
		{"top_p out of range", `{"model":"m",` + msgs + `,"top_p":-1}`, "invalid_value", "top_p"},
		{"five stops", `{"model":"m",` + msgs + `,"stop":["a","b","c","d","e"]}`, "invalid_value", "stop"},
		{"bad response format", `{"model":"m",` + msgs + `,"response_format":{"type":"yaml"}}`, "invalid_value", "response_format.type"},
		{"tool without a name", `{"model":"m",` + msgs + `,"tools":[{"type":"function","function":{}}]}`, "invalid_value", "tools[0]"},
		{"tool choice without tools", `{"model":"m",` + msgs + `,"tool_choice":"required"}`, "invalid_value", "tool_choice"},
		{"tool choice names another tool", `{"model":"m",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}`,
			"invalid_value", "tool_choice"},
		{"gateway without a model", `{` + msgs + `}`, "missing_model", "model"},
		{"kb named twice", `{"model":"sluice-rag/a","kb":"b",` + msgs + `}`, "kb_conflict", "model"},
		{"no messages", `{"model":"m"}`, "no_messages", "messages"},
		{"empty messages", `{"model":"m","messages":[]}`, "no_messages", "messages"},
		{"rag without a user message", `{"model":"sluice-rag","messages":[{"role":"system","content":"s"},{"role":"assistant","content":"a"}]}`, "no_user_message", "messages"},
		{"unknown role", `{"model":"m","messages":[{"role":"robot","content":"q"}]}`, "bad_role", "messages[0].role"},
		{"missing role", `{"model":"m","messages":[{"content":"q"}]}`, "bad_role", "messages[0].role"},
		{"deprecated function role", `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"function","content":"r","name":"f"}]}`, "bad_role", "messages[1].role"},
		{"tool result without its call", `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"tool","content":"r"}]}`, "missing_tool_call_id", "messages[1].tool_call_id"},
		{"null content", `{"model":"m","messages":[{"role":"user","content":null}]}`, "empty_content", "messages[0].content"},
		{"missing content", `{"model":"m","messages":[{"role":"user"}]}`, "empty_content", "messages[0].content"},
		{"no parts", `{"model":"m","messages":[{"role":"user","content":[]}]}`, "empty_content", "messages[0].content"},
		{"assistant with nothing", `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":null}]}`, "empty_content", "messages[1].content"},
		{"unknown part", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"q"},{"type":"video","video":{}}]}]}`,
			"unsupported_content", "messages[0].content[1].type"},
		{"text part without text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`, "bad_content", "messages[0].content[0].text"},
		{"content object", `{"model":"m","messages":[{"role":"user","content":{"text":"q"}}]}`, "bad_content", "messages[0].content"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseCompletionRequest([]byte(tc.body), "")
			var ae *refusal.Error
			if !errors.As(err, &ae) || ae.Class != refusal.Invalid || ae.Code != tc.code || ae.Param != tc.param || ae.Message == "" {
				t.Fatalf("error %#v, want 400 %s on %q", err, tc.code, tc.param)
			}
		})
	}
}

func render(t *testing.T, includeUsage bool, evs ...events.Event) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	w := echo.NewResponse(rec, echo.New())
	out, err := httpio.StartSSE(w, "chat-1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k := &chunkSink{out: out, meta: completionMeta{ID: "chatcmpl-chat-1", Created: 1700000000, Model: "gpt-test"}, includeUsage: includeUsage}
	for _, ev := range evs {
		if err := k.Write(ev); err != nil {
			t.Fatal(err)
		}
	}
	return rec.Result()
}

func ev(typ string, data any) events.Event {
	raw, _ := json.Marshal(data)
	return events.Event{ID: "1-0", Type: typ, Data: raw}
}

func answerEvents() []events.Event {
	return []events.Event{
		ev(events.TypeAccepted, events.Accepted{RequestID: "chat-1", ServiceTier: "flex"}),
		ev(events.TypeStage, events.Stage{Stage: "admission", Pool: "short"}),
		ev(events.TypeQueue, events.Queue{Position: 3, EstimatedWaitMs: 1200, Pool: "short"}),
		ev(events.TypeStage, events.Stage{Stage: "llm"}),
		ev(events.TypeToken, events.Token{Text: "Hello", Index: 0}),
		ev(events.TypeToken, events.Token{Text: " world", Index: 1}),
		ev(events.TypeDone, events.Done{RequestID: "chat-1", Route: "short", FinishReason: "length", KBVersion: 4,
			Sources: []string{"doc-a"}, Usage: events.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12}}),
	}
}

func TestChunkStreamFormat(t *testing.T) {
	resp := render(t, true, answerEvents()...)
	raw, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	if !bytes.Contains(raw, []byte("\n: queued position=3 estimated_wait_ms=1200\n")) || !bytes.Contains(raw, []byte(": stage llm\n")) {
		t.Fatalf("queue and stage are not SSE comments:\n%s", raw)
	}
	datas, done := dataLines(t, raw)
	if !done {
		t.Fatalf("no [DONE]:\n%s", raw)
	}
	if len(datas) != 4 {
		t.Fatalf("%d chunks, want 2 tokens + finish + usage:\n%s", len(datas), raw)
	}
	for i, d := range datas {
		var c map[string]json.RawMessage
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("chunk %d %s: %v", i, d, err)
		}
		if string(c["id"]) != `"chatcmpl-chat-1"` || string(c["object"]) != `"chat.completion.chunk"` ||
			string(c["created"]) != "1700000000" || string(c["model"]) != `"gpt-test"` || string(c["service_tier"]) != `"flex"` {
			t.Fatalf("chunk %d header fields: %s", i, d)
		}
		if _, ok := c["error"]; ok {
			t.Fatalf("chunk %d has an error key: %s", i, d)
		}
	}
	wantChoices := []string{
		`[{"index":0,"delta":{"role":"assistant","content":"Hello"},"logprobs":null,"finish_reason":null}]`,
		`[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}]`,
		`[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]`,
		`[]`,
	}
	for i, want := range wantChoices {
		var c map[string]json.RawMessage
		_ = json.Unmarshal([]byte(datas[i]), &c)
		if string(c["choices"]) != want {
			t.Fatalf("chunk %d choices %s, want %s", i, c["choices"], want)
		}
		wantUsage := "null"
		if i == 3 {
			wantUsage = `{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}`
		}
		if string(c["usage"]) != wantUsage {
			t.Fatalf("chunk %d usage %s, want %s", i, c["usage"], wantUsage)
		}
		if i == 2 && string(c["sluice"]) != `{"request_id":"chat-1","route":"short","kb_version":4,"sources":["doc-a"]}` {
			t.Fatalf("final chunk's sluice extension %s", c["sluice"])
		}
	}

	// Without include_usage: no usage chunk and no usage field.
	raw, _ = io.ReadAll(render(t, false, answerEvents()...).Body)
	datas, done = dataLines(t, raw)
	if !done || len(datas) != 3 || strings.Contains(string(raw), `"usage"`) {
		t.Fatalf("stream without include_usage:\n%s", raw)
	}
}

func dataLines(t *testing.T, raw []byte) ([]string, bool) {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "" || strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "data: "):
			d := strings.TrimPrefix(line, "data: ")
			if d == "[DONE]" {
				for sc.Scan() {
					if sc.Text() != "" {
						t.Fatalf("%q after [DONE]:\n%s", sc.Text(), raw)
					}
				}
				return out, true
			}
			out = append(out, d)
		default:
			t.Fatalf("line %q is neither data nor a comment", line)
		}
	}
	return out, false
}

func TestChunkStreamThroughOpenAIClientParser(t *testing.T) {
	stream := ssestream.NewStream[openai.ChatCompletionChunk](ssestream.NewDecoder(render(t, true, answerEvents()...)), nil)
	var acc openai.ChatCompletionAccumulator
	n := 0
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("accumulator refused chunk %d: %s", n, stream.Current().RawJSON())
		}
		n++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 4 || len(acc.Choices) != 1 {
		t.Fatalf("%d chunks, %d choices", n, len(acc.Choices))
	}
	ch := acc.Choices[0]
	if ch.Message.Content != "Hello world" || string(ch.Message.Role) != "assistant" || ch.FinishReason != "length" {
		t.Fatalf("accumulated %+v", ch)
	}
	if acc.Usage.TotalTokens != 12 || acc.ID != "chatcmpl-chat-1" || acc.Model != "gpt-test" {
		t.Fatalf("accumulated usage %+v id %q model %q", acc.Usage, acc.ID, acc.Model)
	}
	if acc.ServiceTier != "flex" {
		t.Fatalf("the official client reads service_tier %q, want the class the accepted event says", acc.ServiceTier)
	}
}

func TestChunkStreamRejectionAndEmptyAnswer(t *testing.T) {
	resp := render(t, false,
		ev(events.TypeAccepted, events.Accepted{RequestID: "chat-1"}),
		ev(events.TypeQueue, events.Queue{Position: 1, EstimatedWaitMs: 500, Pool: "short"}),
		ev(events.TypeRejected, events.Failure{Reason: request.ReasonQueueTimeout, Message: "The queue is long.", RetryAfterS: 5}))
	raw, _ := io.ReadAll(resp.Body)
	datas, done := dataLines(t, raw)
	if done || len(datas) != 1 || datas[0] != `{"error":{"message":"The queue is long.","type":"server_error","param":null,"code":"queue_timeout"}}` {
		t.Fatalf("rejected stream:\n%s", raw)
	}
	stream := ssestream.NewStream[openai.ChatCompletionChunk](ssestream.NewDecoder(&http.Response{
		Header: resp.Header, Body: io.NopCloser(bytes.NewReader(raw))}), nil)
	for stream.Next() {
		t.Fatalf("chunk before the error: %s", stream.Current().RawJSON())
	}
	var se *ssestream.StreamError
	if !errors.As(stream.Err(), &se) || !strings.Contains(se.Message, "queue_timeout") {
		t.Fatalf("client error %v", stream.Err())
	}

	raw, _ = io.ReadAll(render(t, false, ev(events.TypeDone, events.Done{FinishReason: "eos"})).Body)
	datas, _ = dataLines(t, raw)
	var c struct {
		Choices json.RawMessage `json:"choices"`
	}
	_ = json.Unmarshal([]byte(datas[0]), &c)
	if len(datas) != 1 || string(c.Choices) != `[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":"stop"}]` {
		t.Fatalf("empty answer:\n%s", raw)
	}
}

func TestCompletionFormat(t *testing.T) {
	meta := completionMeta{ID: "chatcmpl-chat-1", Created: 1700000000, Model: "gpt-test"}
	d := events.Done{RequestID: "chat-1", Route: "short", FinishReason: "eos", KBVersion: 4, Sources: []string{"doc-a"},
		Cached: true, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Usage: events.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12}}
	raw, err := json.Marshal(completionOf(meta, []*choiceAnswer{answerOf("Hello world")}, d))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"chatcmpl-chat-1","object":"chat.completion","created":1700000000,"model":"gpt-test",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello world","refusal":null},"logprobs":null,"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12},` +
		`"sluice":{"request_id":"chat-1","route":"short","kb_version":4,"sources":["doc-a"],"cached":true,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}}`
	if string(raw) != want {
		t.Fatalf("completion\n%s\nwant\n%s", raw, want)
	}
	var c openai.ChatCompletion
	if err := json.Unmarshal(raw, &c); err != nil || c.Choices[0].Message.Content != "Hello world" || c.Usage.TotalTokens != 12 {
		t.Fatalf("the official client reads %+v, %v", c, err)
	}
}

func TestAnswerCollector(t *testing.T) {
	var col answerCollector
	for _, e := range answerEvents() {
		_ = col.Write(e)
	}
	if len(col.answers) != 1 || col.answers[0].text.String() != "Hello world" || col.failure != nil || col.done.Usage.TotalTokens != 12 {
		t.Fatalf("collected %+v %+v %+v", col.answers, col.failure, col.done)
	}
	if col.serviceTier != "flex" {
		t.Fatalf("collected service tier %q, want the accepted event's", col.serviceTier)
	}
	for reason, status := range map[string]int{
		request.ReasonQueueTimeout: 503, request.ReasonTenantQueueFull: 503, request.ReasonBackendError: 502,
		request.ReasonCancelled: 410, request.ReasonBadRequest: 400, request.ReasonInternal: 500,
		request.ReasonShed: 503, request.ReasonUnavailable: 503, request.ReasonBackendUnavailable: 503,
	} {
		var col answerCollector
		_ = col.Write(ev(events.TypeRejected, events.Failure{Reason: reason, Message: "m", RetryAfterS: 2}))
		if col.failure == nil || httpio.Status(col.failure.Class) != status || col.failure.Code != reason {
			t.Fatalf("%s: %+v, want status %d", reason, col.failure, status)
		}
	}
}

func answerOf(text string) *choiceAnswer {
	a := &choiceAnswer{}
	a.text.WriteString(text)
	return a
}

func TestSeveralChoices(t *testing.T) {
	done := events.Done{RequestID: "chat-1", FinishReason: "stop", FinishReasons: []string{"stop", "length"},
		Usage: events.Usage{PromptTokens: 5, CompletionTokens: 4, TotalTokens: 9}}
	evs := []events.Event{
		ev(events.TypeToken, events.Token{Text: "a", Index: 0, Model: "m-1"}),
		ev(events.TypeToken, events.Token{Text: "x", Index: 1, Choice: 1}),
		ev(events.TypeToken, events.Token{Text: "b", Index: 2}),
		ev(events.TypeToken, events.Token{Text: "y", Index: 3, Choice: 1}),
		ev(events.TypeDone, done),
	}
	resp := render(t, true, evs...)
	stream := ssestream.NewStream[openai.ChatCompletionChunk](ssestream.NewDecoder(resp), nil)
	var acc openai.ChatCompletionAccumulator
	roles := map[int64]int{}
	for stream.Next() {
		ch := stream.Current()
		if !acc.AddChunk(ch) {
			t.Fatalf("accumulator refused %s", ch.RawJSON())
		}
		for _, c := range ch.Choices {
			if c.Delta.Role != "" {
				roles[c.Index]++
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 2 || acc.Choices[0].Message.Content != "ab" || acc.Choices[1].Message.Content != "xy" ||
		acc.Choices[0].FinishReason != "stop" || acc.Choices[1].FinishReason != "length" || acc.Model != "m-1" {
		t.Fatalf("accumulated %+v", acc.ChatCompletion)
	}
	if roles[0] != 1 || roles[1] != 1 {
		t.Fatalf("roles sent %v, want once per choice", roles)
	}
	var col answerCollector
	for _, e := range evs {
		_ = col.Write(e)
	}
	c := completionOf(completionMeta{ID: "chatcmpl-chat-1", Model: "m-1"}, col.answers, col.done)
	if len(c.Choices) != 2 || *c.Choices[1].Message.Content != "xy" || c.Choices[1].Index != 1 || c.Choices[1].FinishReason != "length" {
		t.Fatalf("completion %+v", c)
	}
}

// A cut answer's content is the model's text as it sent it, a json_object
// answer cut mid-string included: the truncation notice the native API
// streams is not OpenAI content (finish_reason "length" says it was cut).
func TestTruncationNoticeIsNotContent(t *testing.T) {
	model := []string{`{"`, `answer`, `": "`, `token`, ` bucket`}
	var evs []events.Event
	for i, text := range model {
		evs = append(evs, ev(events.TypeToken, events.Token{Text: text, Index: i}))
	}
	evs = append(evs,
		ev(events.TypeToken, events.Token{Text: " … [answer truncated at the length limit]", Index: len(model), Notice: true}),
		ev(events.TypeDone, events.Done{RequestID: "chat-1", FinishReason: "length",
			Usage: events.Usage{PromptTokens: 10, CompletionTokens: len(model), TotalTokens: 10 + len(model)}}))
	want := strings.Join(model, "")

	stream := ssestream.NewStream[openai.ChatCompletionChunk](ssestream.NewDecoder(render(t, false, evs...)), nil)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("accumulator refused %s", stream.Current().RawJSON())
		}
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0]; got.Message.Content != want || got.FinishReason != "length" || chunks != len(model)+1 {
		t.Fatalf("streamed %d chunks, content %q (%s), want %q", chunks, got.Message.Content, got.FinishReason, want)
	}

	var col answerCollector
	for _, e := range evs {
		_ = col.Write(e)
	}
	raw, err := json.Marshal(completionOf(completionMeta{ID: "chatcmpl-chat-1"}, col.answers, col.done))
	if err != nil {
		t.Fatal(err)
	}
	var c openai.ChatCompletion
	if err := json.Unmarshal(raw, &c); err != nil || c.Choices[0].Message.Content != want || c.Choices[0].FinishReason != "length" {
		t.Fatalf("completion %s, %v; want content %q", raw, err, want)
	}
}

// The completion echoes the class the request was served in, as the
// official client reads it; a completion without one leaves it out.
func TestCompletionEchoesServiceTier(t *testing.T) {
	meta := completionMeta{ID: "chatcmpl-chat-1", Created: 1700000000, Model: "gpt-test", ServiceTier: "priority"}
	raw, err := json.Marshal(completionOf(meta, []*choiceAnswer{answerOf("hi")}, events.Done{FinishReason: "stop"}))
	if err != nil {
		t.Fatal(err)
	}
	var c openai.ChatCompletion
	if err := json.Unmarshal(raw, &c); err != nil || c.ServiceTier != "priority" {
		t.Fatalf("the official client reads service_tier %q from %s (%v)", c.ServiceTier, raw, err)
	}
	meta.ServiceTier = ""
	raw, _ = json.Marshal(completionOf(meta, []*choiceAnswer{answerOf("hi")}, events.Done{FinishReason: "stop"}))
	if strings.Contains(string(raw), "service_tier") {
		t.Fatalf("a completion without a class names one: %s", raw)
	}
}

// service_tier is read, not refused, and is the door's to check.
func TestParseServiceTier(t *testing.T) {
	for _, v := range []string{"priority", "auto", "scale"} {
		_, req, err := parseCompletionRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"q"}],"service_tier":"`+v+`"}`), "")
		if err != nil || req.ServiceTier != v {
			t.Errorf("%s: service tier %q, %v", v, req.ServiceTier, err)
		}
	}
}
