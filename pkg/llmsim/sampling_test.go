package llmsim_test

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/openai"
)

// postChat sends a raw chat request and returns the status and body.
func (s *testSim) postChat(t *testing.T, body string) (int, []byte) {
	t.Helper()
	resp, err := s.client.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, raw
}

// completion runs a non-streaming request for one choice and decodes the
// completion.
func (s *testSim) completion(t *testing.T, body map[string]any) (openai.Completion, string) {
	t.Helper()
	c, raw := s.completionN(t, body)
	if len(c.Choices) != 1 {
		t.Fatalf("want one choice: %s", raw)
	}
	return c, raw
}

// completionN runs a non-streaming request and decodes the completion,
// whatever its number of choices.
func (s *testSim) completionN(t *testing.T, body map[string]any) (openai.Completion, string) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	status, raw := s.postChat(t, string(b))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, raw)
	}
	var c openai.Completion
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("decode completion %s: %v", raw, err)
	}
	return c, string(raw)
}

// chunks runs a streaming request with include_usage and decodes every
// chunk before [DONE]. It leaves body as it was.
func (s *testSim) chunks(t *testing.T, body map[string]any) []openai.Chunk {
	t.Helper()
	body = maps.Clone(body)
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	resp, err := post(context.Background(), s.client, s.url+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	payloads, err := readSSE(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if len(payloads) == 0 || payloads[len(payloads)-1] != "[DONE]" {
		t.Fatalf("stream did not end with [DONE]: %q", payloads)
	}
	out := make([]openai.Chunk, len(payloads)-1)
	for i, p := range payloads[:len(payloads)-1] {
		if err := json.Unmarshal([]byte(p), &out[i]); err != nil {
			t.Fatalf("chunk %q: %v", p, err)
		}
	}
	return out
}

func text(c openai.Completion) string {
	if m := c.Choices[0].Message; m.Content != nil {
		return *m.Content
	}
	return ""
}

func TestSamplingValidation(t *testing.T) {
	sim := start(t, testConfig())
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	weather := `{"type":"function","function":{"name":"weather","parameters":{"type":"object"}}}`
	cases := []struct{ name, body, param string }{
		{"temperature above 2", `"temperature":2.5`, "temperature"},
		{"temperature below 0", `"temperature":-0.1`, "temperature"},
		{"top_p 0", `"top_p":0`, "top_p"},
		{"top_p above 1", `"top_p":1.5`, "top_p"},
		{"presence_penalty", `"presence_penalty":3`, "presence_penalty"},
		{"frequency_penalty", `"frequency_penalty":-2.5`, "frequency_penalty"},
		{"logit_bias key", `"logit_bias":{"hello":1}`, "logit_bias"},
		{"logit_bias value", `"logit_bias":{"50256":101}`, "logit_bias"},
		{"five stops", `"stop":["a","b","c","d","e"]`, "stop"},
		{"stop not strings", `"stop":[1]`, ""},
		{"response_format type", `"response_format":{"type":"xml"}`, "response_format.type"},
		{"json_schema missing", `"response_format":{"type":"json_schema"}`, "response_format.json_schema"},
		{"json_schema unnamed", `"response_format":{"type":"json_schema","json_schema":{"schema":{}}}`, "response_format.json_schema.name"},
		{"json_schema not an object", `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":[1]}}`, "response_format.json_schema.schema"},
		{"tool type", `"tools":[{"type":"retrieval","function":{"name":"x"}}]`, "tools[0].type"},
		{"tool without name", `"tools":[{"type":"function","function":{}}]`, "tools[0].function.name"},
		{"tool names repeat", `"tools":[` + weather + `,` + weather + `]`, "tools[1].function.name"},
		{"tool parameters", `"tools":[{"type":"function","function":{"name":"x","parameters":"object"}}]`, "tools[0].function.parameters"},
		{"tool_choice unknown", `"tools":[` + weather + `],"tool_choice":"sometimes"`, "tool_choice"},
		{"tool_choice shape", `"tools":[` + weather + `],"tool_choice":{"type":"function"}`, "tool_choice"},
		{"tool_choice not in tools", `"tools":[` + weather + `],"tool_choice":{"type":"function","function":{"name":"time"}}`, "tool_choice"},
		{"tool_choice without tools", `"tool_choice":"auto"`, "tool_choice"},
		{"required without tools", `"tool_choice":"required"`, "tool_choice"},
		{"n above 8", `"n":9`, "n"},
		{"n 0", `"n":0`, "n"},
		{"n negative", `"n":-1`, "n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, raw := sim.postChat(t, `{`+msgs+`,`+tc.body+`}`)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatalf("decode %s: %v", raw, err)
			}
			if status != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
				t.Fatalf("got %d %s, want 400 invalid_request_error", status, raw)
			}
			if tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param) {
				t.Errorf("param = %v in %s, want %q", e.Error.Param, raw, tc.param)
			}
		})
	}
	if st := sim.Stats(); st.Running+st.Waiting != 0 {
		t.Errorf("rejected requests reached the engine: %+v", st)
	}
}

func TestSamplingBoundsAccepted(t *testing.T) {
	sim := start(t, testConfig())
	bodies := []string{
		`"temperature":0,"top_p":1,"presence_penalty":-2,"frequency_penalty":2,"logit_bias":{"50256":-100,"0":100}`,
		`"temperature":2,"top_p":0.01,"stop":["a","b","c","d"],"seed":-7`,
		`"stop":"one","response_format":{"type":"text"},"tool_choice":"none"`,
		`"response_format":{"type":"json_schema","json_schema":{"name":"x"}},"parallel_tool_calls":false`,
		// A tool result after an assistant message with no content but
		// its calls.
		`"tools":[{"type":"function","function":{"name":"weather"}}],"messages":[{"role":"user","content":"hi"},
		 {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{}"}}]},
		 {"role":"tool","tool_call_id":"call_1","content":"sunny"}]`,
	}
	for _, b := range bodies {
		body := `{"max_tokens":3,` + b + `}`
		if !strings.Contains(b, `"messages"`) {
			body = `{"max_tokens":3,"messages":[{"role":"user","content":"hi"}],` + b + `}`
		}
		if status, raw := sim.postChat(t, body); status != http.StatusOK {
			t.Errorf("%s: got %d %s, want 200", b, status, raw)
		}
	}
	status, raw := sim.postChat(t, `{"messages":[{"role":"user","content":"hi"},{"role":"tool","content":"sunny"}]}`)
	if status != http.StatusBadRequest || !strings.Contains(string(raw), `"param":"messages[1].tool_call_id"`) {
		t.Errorf("tool message without tool_call_id: %d %s", status, raw)
	}
}

func TestRefuseParams(t *testing.T) {
	cfg := testConfig()
	cfg.RefuseParams = []string{"logit_bias"}
	sim := start(t, cfg)
	status, raw := sim.postChat(t, `{"messages":[{"role":"user","content":"hi"}],"temperature":1,"logit_bias":{"1":5}}`)
	want := `{"error":{"message":"logit_bias is not supported by this model","type":"invalid_request_error","param":"logit_bias"}}`
	if status != http.StatusBadRequest || strings.TrimSpace(string(raw)) != want {
		t.Errorf("got %d %s, want 400 %s", status, raw, want)
	}
	if status, raw := sim.postChat(t, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"seed":1}`); status != http.StatusOK {
		t.Errorf("a request without logit_bias: %d %s", status, raw)
	}

	if status, _, raw := sim.setConfig(t, `{"refuse_params": ["seed", "tools"]}`); status != http.StatusOK {
		t.Fatalf("set refuse_params: %d %s", status, raw)
	}
	if got := sim.getConfig(t)["refuse_params"]; len(got.([]any)) != 2 {
		t.Errorf("GET /admin/config refuse_params = %v", got)
	}
	status, raw = sim.postChat(t, `{"messages":[{"role":"user","content":"hi"}],"seed":1}`)
	if status != http.StatusBadRequest || !strings.Contains(string(raw), `"param":"seed"`) {
		t.Errorf("seed after the update: %d %s", status, raw)
	}
	if status, raw := sim.postChat(t, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"logit_bias":{"1":5}}`); status != http.StatusOK {
		t.Errorf("logit_bias after the update: %d %s", status, raw)
	}
	if status, _, raw := sim.setConfig(t, `{"refuse_params": ["top_k"]}`); status != http.StatusBadRequest {
		t.Errorf("unknown parameter accepted: %d %s", status, raw)
	}
	if status, _, raw := sim.setConfig(t, `{"refuse_params": []}`); status != http.StatusOK {
		t.Fatalf("clear refuse_params: %d %s", status, raw)
	}
	if status, raw := sim.postChat(t, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"seed":1}`); status != http.StatusOK {
		t.Errorf("seed after clearing: %d %s", status, raw)
	}

	bad := testConfig()
	bad.RefuseParams = []string{"temprature"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "RefuseParams ") {
		t.Errorf("Validate = %v, want an error naming RefuseParams", err)
	}
	if _, err := llmsim.New(bad, nil); err == nil {
		t.Error("New accepted a misspelt refused parameter")
	}
}

func TestSeedDecidesTheAnswer(t *testing.T) {
	sim := start(t, testConfig())
	ctx := context.Background()
	answer := func(extra map[string]any) string {
		body := map[string]any{"messages": userMsg("What does the KV cache hold?"), "max_tokens": 30}
		for k, v := range extra {
			body[k] = v
		}
		res, err := sim.streamChat(ctx, body)
		if err != nil {
			t.Fatal(err)
		}
		return res.Text
	}
	none := answer(nil)
	seven, seven2, eight := answer(map[string]any{"seed": 7}), answer(map[string]any{"seed": 7, "top_p": 0.5}), answer(map[string]any{"seed": 8})
	if seven != seven2 {
		t.Errorf("same seed, different answers:\n%q\n%q", seven, seven2)
	}
	if seven == eight || seven == none {
		t.Errorf("seeds 7, 8 and none gave %q, %q, %q; want three answers", seven, eight, none)
	}
	// Greedy decoding is the same whatever the seed.
	greedy7 := answer(map[string]any{"seed": 7, "temperature": 0})
	greedy8 := answer(map[string]any{"seed": 8, "temperature": 0})
	if greedy7 != greedy8 || greedy7 != none {
		t.Errorf("temperature 0 depends on the seed:\n%q\n%q\n%q", greedy7, greedy8, none)
	}
}

// streamTokens returns the text of every content chunk of a stream.
func streamTokens(t *testing.T, chunks []openai.Chunk) (toks []string, finish string, u openai.Usage) {
	t.Helper()
	for i, c := range chunks {
		if c.Usage.Value != nil {
			u = *c.Usage.Value
		}
		if len(c.Choices) == 0 {
			continue
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
		if i > 0 && ch.Delta.Content != nil {
			toks = append(toks, *ch.Delta.Content)
		}
	}
	return toks, finish, u
}

func TestStopAcrossTokens(t *testing.T) {
	sim := start(t, testConfig())
	question := "Why does preemption recompute the prompt?"
	body := func(stop any) map[string]any {
		b := map[string]any{"messages": userMsg(question), "max_tokens": 200}
		if stop != nil {
			b["stop"] = stop
		}
		return b
	}
	toks, _, _ := streamTokens(t, sim.chunks(t, body(nil)))
	full := strings.Join(toks, "")
	// A stop sequence made of the end of token k and the start of token
	// k+1, which appears nowhere before.
	var stop string
	var k, at int
	for k = 3; k < len(toks)-1; k++ {
		a, b := toks[k], toks[k+1]
		stop = a[max(0, len(a)-2):] + b[:min(3, len(b))]
		at = len(strings.Join(toks[:k], "")) + len(a) - len(a[max(0, len(a)-2):])
		if strings.Index(full, stop) == at {
			break
		}
	}
	if k == len(toks)-1 {
		t.Fatalf("no usable stop sequence in %q", full)
	}

	got, finish, u := streamTokens(t, sim.chunks(t, body([]string{"never written", stop})))
	if want := full[:at]; strings.Join(got, "") != want || finish != "stop" {
		t.Errorf("stop %q: streamed %q (%s), want %q (stop)", stop, strings.Join(got, ""), finish, want)
	}
	// The tokens that write the stop sequence are spent, not sent.
	if u.CompletionTokens != k+2 {
		t.Errorf("completion tokens %d, want %d (through the token that completes the stop)", u.CompletionTokens, k+2)
	}
	for i, tok := range got {
		if tok == "" {
			t.Errorf("chunk %d has empty content", i)
		}
	}

	c, _ := sim.completion(t, body(stop))
	if text(c) != full[:at] || c.Choices[0].FinishReason != "stop" || c.Usage.CompletionTokens != k+2 {
		t.Errorf("non-streaming: %q %s %+v, want %q stop", text(c), c.Choices[0].FinishReason, c.Usage, full[:at])
	}
	c, _ = sim.completion(t, body("zzz"))
	if text(c) != full {
		t.Errorf("a stop sequence never written changed the answer: %q", text(c))
	}
}

func TestJSONObjectAnswer(t *testing.T) {
	sim := start(t, testConfig())
	body := map[string]any{"messages": userMsg("Reply in JSON: what is batching?"), "response_format": map[string]any{"type": "json_object"}}
	c, _ := sim.completion(t, body)
	var out map[string]any
	if err := json.Unmarshal([]byte(text(c)), &out); err != nil {
		t.Fatalf("answer %q is not JSON: %v", text(c), err)
	}
	if s, ok := out["answer"].(string); !ok || len(strings.Fields(s)) < 5 || c.Choices[0].FinishReason != "stop" {
		t.Errorf("answer = %q (%s), want {\"answer\": words}, stop", text(c), c.Choices[0].FinishReason)
	}
	toks, finish, u := streamTokens(t, sim.chunks(t, body))
	if strings.Join(toks, "") != text(c) || finish != "stop" || u.CompletionTokens != c.Usage.CompletionTokens || len(toks) != u.CompletionTokens {
		t.Errorf("streamed %q (%s, %+v), want the completion's answer in one token a chunk", strings.Join(toks, ""), finish, u)
	}

	body["max_tokens"] = 4
	c, _ = sim.completion(t, body)
	if c.Choices[0].FinishReason != "length" || c.Usage.CompletionTokens != 4 || json.Valid([]byte(text(c))) {
		t.Errorf("max_tokens 4: %q %s %+v, want cut JSON with finish length", text(c), c.Choices[0].FinishReason, c.Usage)
	}
}

func TestJSONSchemaAnswer(t *testing.T) {
	sim := start(t, testConfig())
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"summary": map[string]any{"type": "string"},
			"year":    map[string]any{"type": "integer"},
			"score":   map[string]any{"type": []string{"number", "null"}},
			"ok":      map[string]any{"type": "boolean"},
			"tags":    map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
			"meta":    map[string]any{"type": "object"},
			"kind":    map[string]any{"enum": []string{"short", "long"}},
		},
	}
	c, _ := sim.completion(t, map[string]any{
		"messages":        userMsg("Summarise the report."),
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "report", "schema": schema}},
	})
	var out struct {
		Summary string         `json:"summary"`
		Year    *int           `json:"year"`
		Score   *float64       `json:"score"`
		OK      *bool          `json:"ok"`
		Tags    []string       `json:"tags"`
		Meta    map[string]any `json:"meta"`
		Kind    string         `json:"kind"`
	}
	dec := json.NewDecoder(strings.NewReader(text(c)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("answer %q does not fit the schema: %v", text(c), err)
	}
	if out.Summary == "" || out.Year == nil || out.Score == nil || out.OK == nil || !*out.OK || out.Tags == nil || out.Meta == nil || out.Kind != "short" {
		t.Errorf("answer %q lacks a property or has the wrong value", text(c))
	}
}

func TestModelNameIsTheRequests(t *testing.T) {
	sim := start(t, testConfig())
	c, _ := sim.completion(t, map[string]any{"model": "llama-3-8b", "messages": userMsg("hi"), "max_tokens": 2})
	if c.Model != "llama-3-8b" {
		t.Errorf("model = %q, want the request's", c.Model)
	}
	c, _ = sim.completion(t, map[string]any{"messages": userMsg("hi"), "max_tokens": 2})
	if c.Model != "sluice-sim" {
		t.Errorf("model = %q, want the served model when the request names none", c.Model)
	}
	for _, ch := range sim.chunks(t, map[string]any{"model": "", "messages": userMsg("hi"), "max_tokens": 2}) {
		if ch.Model != "sluice-sim" {
			t.Errorf("chunk model = %q, want sluice-sim", ch.Model)
		}
	}
}
