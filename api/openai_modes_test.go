package api

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// startedInput posts body to /v1/chat/completions and returns the one
// workflow input it started.
func startedInput(t *testing.T, srv *Server, tc *countingClient, body string, header map[string]string) workflows.ChatInput {
	t.Helper()
	rec := postCompletion(srv, body, header)
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if len(tc.inputs) != 1 {
		t.Fatalf("%d workflow starts; response %d %s", len(tc.inputs), rec.Code, rec.Body)
	}
	return tc.inputs[0]
}

// Gateway mode sends the client's conversation, whole, with its
// parameters, to the pool serving the model it names; no kb is read.
func TestGatewayModeStartsTheWholeConversation(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) { c.Pools.Long.Model = "big-model" })
	body := `{"model":"big-model","temperature":0.1,"stop":["END"],"messages":[{"role":"system","content":"be brief"},
		{"role":"user","content":"what is 6*7?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"calc","arguments":"{\"x\":\"6*7\"}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"42","x_backend_extension":1}],
		"tools":[{"type":"function","function":{"name":"calc","parameters":{"type":"object"}}}]}`
	in := startedInput(t, srv, tc, body, nil)
	if !in.Gateway || in.Query != "" || in.KB != "" || len(in.Conversation) != 4 {
		t.Fatalf("input %+v", in)
	}
	// The short prompt would route short; only the long pool serves the
	// model it names.
	if in.Pool != request.PoolLong {
		t.Fatalf("pool %q, want the long pool, which serves big-model", in.Pool)
	}
	raw, err := in.Conversation[3].MarshalJSON()
	if err != nil || !strings.Contains(string(raw), `"x_backend_extension":1`) {
		t.Fatalf("the tool message is not forwarded whole: %s %v", raw, err)
	}
	if in.Sampling == nil || *in.Sampling.Temperature != 0.1 || in.Sampling.Stop[0] != "END" || len(in.Sampling.Tools) != 1 {
		t.Fatalf("sampling %+v", in.Sampling)
	}
	if in.Settings.AnswerCache {
		t.Fatal("a gateway request uses the answer cache")
	}
}

// RAG mode keeps the conversation too, and retrieves for its last user
// message from the kb the alias names.
func TestRAGModeByAlias(t *testing.T) {
	srv, tc, _ := newTestServer(t, nil)
	body := `{"model":"sluice-rag/sluice-docs","messages":[{"role":"user","content":"first"},{"role":"assistant","content":"an answer"},
		{"role":"user","content":"how do buckets refill?"}]}`
	in := startedInput(t, srv, tc, body, nil)
	if in.Gateway || in.Query != "how do buckets refill?" || in.KB != "sluice-docs" || len(in.Conversation) != 3 || in.Sampling != nil {
		t.Fatalf("input %+v", in)
	}
}

// A parameter the routed pool's backend cannot take is refused at the
// door, naming it, rather than dropped or sent to fail there.
func TestPoolRefusesWhatItsBackendCannotDo(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.Pools.Short.Unsupported = []string{"logit_bias", "image_url"}
		c.Pools.Long.Unsupported = []string{"logit_bias", "image_url"}
	})
	for _, tc2 := range []struct{ body, param string }{
		{`{"model":"sluice-sim","messages":[{"role":"user","content":"q"}],"logit_bias":{"1":5}}`, "logit_bias"},
		{`{"model":"sluice-sim","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}]}]}`, "image_url"},
	} {
		assertOpenAIError(t, postCompletion(srv, tc2.body, nil), 400, "invalid_request_error", "unsupported_parameter", tc2.param)
	}
	if tc.starts.Load() != 0 {
		t.Fatal("a refused request started")
	}
	// What the pool takes goes through.
	startedInput(t, srv, tc, `{"model":"sluice-sim","messages":[{"role":"user","content":"q"}],"temperature":0}`, nil)
}

// A conversation longer than any pool takes is refused as OpenAI refuses
// one too long for its model.
func TestConversationTooLongForAnyPool(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.API.MaxBodyBytes = 1 << 20
		c.Pools.Long.MaxPromptTokens = 600
	})
	body := `{"model":"sluice-sim","messages":[{"role":"user","content":"` + strings.Repeat("word ", 700) + `"}]}`
	assertOpenAIError(t, postCompletion(srv, body, nil), 400, "invalid_request_error", "context_length_exceeded", "messages")
	// An image counts too.
	img := `{"type":"image_url","image_url":{"url":"data:x"}}`
	body = `{"model":"sluice-sim","messages":[{"role":"user","content":[` + img + `]}]}`
	assertOpenAIError(t, postCompletion(srv, body, nil), 400, "invalid_request_error", "context_length_exceeded", "messages")
	if tc.starts.Load() != 0 {
		t.Fatal("started")
	}
}

// n answers are asked of the backend; the fair order places the request
// at its prompt whatever n (its answers are charged as they stream); a
// pool whose backend cannot give them refuses n.
func TestSeveralChoicesAtTheDoor(t *testing.T) {
	srv, tc, _ := newTestServer(t, nil)
	in := startedInput(t, srv, tc, `{"model":"sluice-sim","n":3,"max_tokens":10,"messages":[{"role":"user","content":"q"}]}`, nil)
	if in.Choices != 3 {
		t.Fatalf("choices %d", in.Choices)
	}
	one := startedInputAgain(t, srv, tc, `{"model":"sluice-sim","max_tokens":10,"messages":[{"role":"user","content":"q"}]}`)
	if in.AdmissionTokens != one.AdmissionTokens || in.AdmissionTokens == 0 || one.Choices != 0 {
		t.Fatalf("3 answers of 10 tokens placed at %d, one answer at %d: want both at the prompt", in.AdmissionTokens, one.AdmissionTokens)
	}
	srv, tc, _ = newTestServer(t, func(c *config.Config) { c.Pools.Short.Unsupported = []string{"n"} })
	assertOpenAIError(t, postCompletion(srv, `{"model":"sluice-sim","n":2,"messages":[{"role":"user","content":"q"}]}`, nil),
		400, "invalid_request_error", "unsupported_parameter", "n")
	assertOpenAIError(t, postCompletion(srv, `{"model":"sluice-sim","n":9,"messages":[{"role":"user","content":"q"}]}`, nil),
		400, "invalid_request_error", "invalid_value", "n")
	if tc.starts.Load() != 0 {
		t.Fatal("a refused request started")
	}
}

// startedInputAgain posts body and returns the input of the start it made.
func startedInputAgain(t *testing.T, srv *Server, tc *countingClient, body string) workflows.ChatInput {
	t.Helper()
	tc.mu.Lock()
	before := len(tc.inputs)
	tc.mu.Unlock()
	rec := postCompletion(srv, body, nil)
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if len(tc.inputs) != before+1 {
		t.Fatalf("no workflow start; response %d %s", rec.Code, rec.Body)
	}
	return tc.inputs[before]
}

// A conversation too long for the pool of the model it names goes to
// that pool's first fallback pool that takes it, saying so, rather than
// being refused; a model fallback, on the same pool's endpoints, has the
// pool's limit, and the conversation is refused as before.
func TestConversationTooLongForItsModelGoesToAFallbackPool(t *testing.T) {
	long := `{"model":"small-model","messages":[{"role":"user","content":"` + strings.Repeat("word ", 700) + `"}]}`
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.API.MaxBodyBytes = 1 << 20
		c.Pools.Short.Model = "small-model"
		c.Pools.Short.Fallbacks = []config.Fallback{{Model: "smaller-model"}, {Pool: "long"}}
	})
	in := startedInput(t, srv, tc, long, nil)
	want := events.Fallback{From: "small-model", To: "sluice-sim", FromPool: "short", ToPool: "long", Reason: request.FallbackContextTooLong}
	if in.Pool != "long" || in.Fallback == nil || *in.Fallback != want {
		t.Fatalf("started in %q with fallback %+v, want long after %+v", in.Pool, in.Fallback, want)
	}

	srv, tc, _ = newTestServer(t, func(c *config.Config) {
		c.API.MaxBodyBytes = 1 << 20
		c.Pools.Short.Model = "small-model"
		c.Pools.Short.Fallbacks = []config.Fallback{{Model: "smaller-model"}}
	})
	assertOpenAIError(t, postCompletion(srv, long, nil), 400, "invalid_request_error", "context_length_exceeded", "messages")
	if tc.starts.Load() != 0 {
		t.Fatal("a conversation no pool takes started")
	}
}
