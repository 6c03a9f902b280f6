package openai

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/pkg/answer"
	"github.com/sluice-dev/sluice/pkg/events"
	wire "github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

func TestParseResponseRequest(t *testing.T) {
	cases := []struct {
		name, body string
		// roles are the conversation's messages' roles, in order.
		roles     []string
		query, kb string
		gateway   bool
		sampling  []string
		maxTokens int
	}{
		{name: "a string", body: `{"model":"m","input":"hi"}`, roles: []string{"user"}, gateway: true},
		{name: "instructions lead", body: `{"model":"m","input":"hi","instructions":"be brief"}`, roles: []string{"system", "user"}, gateway: true},
		{name: "items", body: `{"model":"m","input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"q"},
			{"type":"input_image","image_url":"data:image/png;base64,AA=="}]},{"role":"assistant","content":[{"type":"output_text","text":"a"}]}]}`,
			roles: []string{"developer", "user", "assistant"}, gateway: true},
		{name: "function calls and their outputs", body: `{"model":"m","input":[{"role":"user","content":"q"},
			{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
			{"type":"function_call_output","call_id":"c1","output":"1"},{"type":"function_call_output","call_id":"c2","output":"2"}]}`,
			roles: []string{"user", "assistant", "tool", "tool"}, gateway: true},
		{name: "rag", body: `{"model":"sluice-rag/docs","input":"what is a bucket?"}`, roles: []string{"user"}, query: "what is a bucket?", kb: "docs"},
		{name: "sampling", body: `{"model":"m","input":"q","temperature":0.5,"top_p":0.9,"max_output_tokens":40,
			"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},
			"parallel_tool_calls":false,"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"}}},
			"metadata":{"k":"v"},"store":false,"background":false,"truncation":"disabled","user":"u"}`,
			roles: []string{"user"}, gateway: true, maxTokens: 40,
			sampling: []string{"temperature", "top_p", "response_format", "tools", "tool_choice", "parallel_tool_calls"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, req, err := parseResponseRequest([]byte(tc.body), "")
			if err != nil {
				t.Fatal(err)
			}
			var roles []string
			for _, m := range req.Conversation {
				roles = append(roles, m.Role)
			}
			if strings.Join(roles, ",") != strings.Join(tc.roles, ",") || req.Query != tc.query || req.KB != tc.kb || req.Gateway != tc.gateway {
				t.Fatalf("roles %v query %q kb %q gateway %v", roles, req.Query, req.KB, req.Gateway)
			}
			var set []string
			if req.Sampling != nil {
				set = req.Sampling.Set()
			}
			if strings.Join(set, ",") != strings.Join(tc.sampling, ",") {
				t.Fatalf("sampling %v, want %v", set, tc.sampling)
			}
			if (tc.maxTokens == 0) != (req.MaxTokens == nil) || req.MaxTokens != nil && *req.MaxTokens != tc.maxTokens {
				t.Fatalf("max tokens %v, want %d", req.MaxTokens, tc.maxTokens)
			}
		})
	}
}

// The conversion keeps what the backend needs: the calls under one
// assistant message with their ids, each output answering its call, the
// schema under json_schema, and the named tool choice nested.
func TestParseResponseRequestConverts(t *testing.T) {
	_, req, err := parseResponseRequest([]byte(`{"model":"m","input":[{"role":"user","content":"q"},
		{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":1}"},{"type":"function_call_output","call_id":"c1","output":"42"}],
		"tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"},
		"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"},"strict":true}}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(req.Conversation)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},` +
		`{"role":"tool","content":"42","tool_call_id":"c1"}]`
	if string(raw) != want {
		t.Fatalf("conversation %s\nwant %s", raw, want)
	}
	if got := string(req.Sampling.ToolChoice); got != `{"function":{"name":"f"},"type":"function"}` {
		t.Fatalf("tool_choice %s", got)
	}
	if got := string(req.Sampling.ResponseFormat.JSONSchema); got != `{"description":"","name":"s","schema":{"type":"object"},"strict":true}` {
		t.Fatalf("json_schema %s", got)
	}
}

func TestParseResponseRequestRefusals(t *testing.T) {
	cases := []struct{ name, body, code, param string }{
		{"malformed", `{"input":`, "bad_json", ""},
		{"no input", `{"model":"m"}`, "missing_input", "input"},
		{"empty input", `{"model":"m","input":""}`, "empty_input", "input"},
		{"no items", `{"model":"m","input":[]}`, "empty_input", "input"},
		{"input object", `{"model":"m","input":{"role":"user"}}`, "bad_input", "input"},
		{"reasoning", `{"model":"m","input":"q","reasoning":{"effort":"low"}}`, "unsupported_parameter", "reasoning"},
		{"truncation auto", `{"model":"m","input":"q","truncation":"auto"}`, "unsupported_parameter", "truncation"},
		{"unknown item", `{"model":"m","input":[{"type":"reasoning","summary":[]}]}`, "unsupported_value", "input[0].type"},
		{"bad role", `{"model":"m","input":[{"role":"tool","content":"x"}]}`, "bad_role", "input[0].role"},
		{"empty parts", `{"model":"m","input":[{"role":"user","content":[]}]}`, "bad_content", "input[0].content"},
		{"unknown part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_video"}]}]}`, "unsupported_content", "input[0].content[0].type"},
		{"image by file id", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"file_1"}]}]}`,
			"unsupported_value", "input[0].content[0].image_url"},
		{"call without its id", `{"model":"m","input":[{"type":"function_call","name":"f"}]}`, "invalid_value", "input[0]"},
		{"output without its call", `{"model":"m","input":[{"type":"function_call_output","output":"1"}]}`, "missing_tool_call_id", "input[0].call_id"},
		{"web search", `{"model":"m","input":"q","tools":[{"type":"web_search"}]}`, "unsupported_value", "tools[0].type"},
		{"tool without a name", `{"model":"m","input":"q","tools":[{"type":"function"}]}`, "invalid_value", "tools[0].name"},
		{"tool choice of nothing", `{"model":"m","input":"q","tool_choice":{"type":"function","name":"g"},"tools":[{"type":"function","name":"f"}]}`,
			"invalid_value", "tool_choice"},
		{"temperature", `{"model":"m","input":"q","temperature":3}`, "invalid_value", "temperature"},
		{"too much metadata", `{"model":"m","input":"q","metadata":{"` + strings.Repeat("k", 65) + `":"v"}}`, "invalid_value", "metadata"},
		{"no model", `{"input":"q"}`, "missing_model", "model"},
		{"rag without a user message", `{"model":"sluice-rag","input":[{"role":"system","content":"s"}]}`, "no_user_message", "input"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseResponseRequest([]byte(tc.body), "")
			var ae *refusal.Error
			if !errors.As(err, &ae) || ae.Class != refusal.Invalid || ae.Code != tc.code || ae.Param != tc.param || ae.Message == "" {
				t.Fatalf("error %#v, want 400 %s on %q", err, tc.code, tc.param)
			}
		})
	}
}

// renderResponse writes evs through a Responses stream.
func renderResponse(t *testing.T, evs ...events.Event) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	w := echo.NewResponse(rec, echo.New())
	out, err := httpio.StartSSE(w, "chat-01J", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k := &responseSink{out: &out, enc: answer.NewResponseEncoder("chat-01J", responseBase(responseRequest{}, "gpt-test", 1700000000))}
	for _, ev := range evs {
		if err := k.Write(ev); err != nil {
			t.Fatal(err)
		}
	}
	return rec.Result()
}

// readResponseStream reads a Responses stream as the official Go client
// does, and feeds each event to its accumulator, which checks that the
// items and parts the events name exist.
func readResponseStream(t *testing.T, resp *http.Response) ([]responses.ResponseStreamEventUnion, *responses.Response) {
	t.Helper()
	stream := ssestream.NewStream[responses.ResponseStreamEventUnion](ssestream.NewDecoder(resp), nil)
	var acc responses.ResponseAccumulator
	var evs []responses.ResponseStreamEventUnion
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != int64(len(evs)) {
			t.Fatalf("event %d (%s) has sequence_number %d", len(evs), ev.Type, ev.SequenceNumber)
		}
		var server responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(ev.RawJSON()), &server); err != nil {
			t.Fatalf("event %d: %v", len(evs), err)
		}
		if err := acc.AddEvent(server); err != nil {
			t.Fatalf("the client's accumulator refused event %d %s: %v", len(evs), ev.RawJSON(), err)
		}
		evs = append(evs, ev)
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	final, err := acc.ReconstructedResponse()
	if err != nil {
		t.Fatalf("no final response: %v", err)
	}
	return evs, final
}

func TestResponseStreamThroughOpenAIClient(t *testing.T) {
	evs, final := readResponseStream(t, renderResponse(t, answerEvents()...))
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	want := []string{"response.created", "response.queued", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v\nwant %v", types, want)
	}
	if final.OutputText() != "Hello world" || final.Status != "incomplete" || final.IncompleteDetails.Reason != "max_output_tokens" {
		t.Fatalf("final: text %q status %s incomplete %+v", final.OutputText(), final.Status, final.IncompleteDetails)
	}
	if final.ID != "resp_01J" || final.Usage.InputTokens != 10 || final.Usage.OutputTokens != 2 || final.Usage.TotalTokens != 12 ||
		string(final.ServiceTier) != "flex" || final.Model != "gpt-test" {
		t.Fatalf("final: id %s usage %+v tier %s model %s", final.ID, final.Usage, final.ServiceTier, final.Model)
	}
}

func TestResponseStreamToolCalls(t *testing.T) {
	evs, final := readResponseStream(t, renderResponse(t,
		ev(events.TypeAccepted, events.Accepted{RequestID: "chat-01J"}),
		ev(events.TypeToken, events.Token{Index: 0, Model: "m-1", ToolCalls: []wire.ToolCallDelta{{Index: 0, ID: "call_a", Type: "function",
			Function: wire.FunctionCallDelta{Name: "f", Arguments: `{"x":`}}}}),
		ev(events.TypeToken, events.Token{Index: 1, ToolCalls: []wire.ToolCallDelta{{Index: 0, Function: wire.FunctionCallDelta{Arguments: `1}`}}}}),
		ev(events.TypeToken, events.Token{Index: 2, ToolCalls: []wire.ToolCallDelta{{Index: 1, ID: "call_b", Type: "function",
			Function: wire.FunctionCallDelta{Name: "g", Arguments: `{}`}}}}),
		ev(events.TypeDone, events.Done{RequestID: "chat-01J", FinishReason: "tool_calls", Usage: events.Usage{PromptTokens: 5, CompletionTokens: 3, TotalTokens: 8}})))
	if last := evs[len(evs)-1]; last.Type != "response.completed" {
		t.Fatalf("last event %s", last.Type)
	}
	if len(final.Output) != 2 || final.Status != "completed" || final.Model != "m-1" {
		t.Fatalf("final: %d items, status %s, model %s", len(final.Output), final.Status, final.Model)
	}
	for i, wantCall := range []struct{ id, name, args string }{{"call_a", "f", `{"x":1}`}, {"call_b", "g", `{}`}} {
		call := final.Output[i].AsFunctionCall()
		if call.CallID != wantCall.id || call.Name != wantCall.name || call.Arguments != wantCall.args {
			t.Fatalf("call %d: %+v", i, call)
		}
	}
}

func TestResponseStreamFailure(t *testing.T) {
	raw, _ := io.ReadAll(renderResponse(t,
		ev(events.TypeAccepted, events.Accepted{RequestID: "chat-01J"}),
		ev(events.TypeQueue, events.Queue{Position: 2, EstimatedWaitMs: 800, Pool: "short"}),
		ev(events.TypeRejected, events.Failure{Reason: request.ReasonQueueTimeout, Message: "The queue is long.", RetryAfterS: 5})).Body)
	if !strings.Contains(string(raw), ": queued position=2 estimated_wait_ms=800\n") {
		t.Fatalf("the queue place is not a comment:\n%s", raw)
	}
	evs, final := readResponseStream(t, &http.Response{Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(strings.NewReader(string(raw)))})
	if last := evs[len(evs)-1]; last.Type != "response.failed" {
		t.Fatalf("last event %s", last.Type)
	}
	if final.Status != "failed" || final.Error.Message != "The queue is long." || string(final.Error.Code) != "rate_limit_exceeded" {
		t.Fatalf("final: status %s error %+v", final.Status, final.Error)
	}
}

// The events are a function of the log alone: a second reader encoding
// the same log from its start numbers every event alike, so that the
// events after sequence number N are the tail of the first reader's
// stream, whatever N (what a re-attached reader from N will rely on).
func TestResponseEventsAreTheLogs(t *testing.T) {
	log := append(answerEvents()[:4], ev(events.TypeToken, events.Token{Text: "Hello", Index: 0}),
		ev(events.TypeToken, events.Token{Index: 1, ToolCalls: []wire.ToolCallDelta{{Index: 0, ID: "c", Type: "function",
			Function: wire.FunctionCallDelta{Name: "f", Arguments: "{}"}}, {Index: 1, ID: "d", Type: "function",
			Function: wire.FunctionCallDelta{Name: "g", Arguments: "{}"}}, {Index: 2, ID: "e", Type: "function",
			Function: wire.FunctionCallDelta{Name: "h", Arguments: "{}"}}}}),
		ev(events.TypeDone, events.Done{RequestID: "chat-01J", FinishReason: "tool_calls"}))
	encode := func() []string {
		enc := answer.NewResponseEncoder("chat-01J", responseBase(responseRequest{}, "m", 1700000000))
		var out []string
		for _, e := range log {
			for _, re := range enc.Encode(e) {
				raw, err := json.Marshal(re)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, string(raw))
			}
		}
		return out
	}
	// Several calls: an encoder that walked its calls by map order
	// would number their events differently from one reader to the next.
	first, second := encode(), encode()
	if len(first) < 10 {
		t.Fatalf("%d events", len(first))
	}
	for n := range first {
		if second[n] != first[n] {
			t.Fatalf("event %d differs between two readers:\n%s\n%s", n, first[n], second[n])
		}
		var e struct {
			SequenceNumber int `json:"sequence_number"`
		}
		if err := json.Unmarshal([]byte(first[n]), &e); err != nil || e.SequenceNumber != n {
			t.Fatalf("event %d numbered %d (%v)", n, e.SequenceNumber, err)
		}
	}
}
