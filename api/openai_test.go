package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/limiter"
)

// assertOpenAIError checks an OpenAI-shaped error: all four fields
// present (param may be null), and nothing else in the error object.
func assertOpenAIError(t *testing.T, rec *httptest.ResponseRecorder, status int, typ, code, param string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q", ct)
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatalf("body %s: %v", rec.Body, err)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Fatalf("error object %s lacks %q", rec.Body, k)
		}
	}
	if len(raw["error"]) != 4 || len(raw) != 1 {
		t.Fatalf("error body %s has more than OpenAI's fields", rec.Body)
	}
	var body openAIErrorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	e := body.Error
	if *e.Type != typ || *e.Code != code || *e.Message == "" {
		t.Fatalf("error %s, want type %s code %s", rec.Body, typ, code)
	}
	if (param == "") != (e.Param == nil) || (e.Param != nil && *e.Param != param) {
		t.Fatalf("error %s, want param %q", rec.Body, param)
	}
}

func postCompletion(srv *Server, body string, header map[string]string) *httptest.ResponseRecorder {
	return postOpenAI(srv, "/v1/chat/completions", body, header)
}

// postOpenAI posts body to an OpenAI route as k-acme, with header.
func postOpenAI(srv *Server, path, body string, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k-acme")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}

// Every refusal before the answer starts is an HTTP status with an
// OpenAI-shaped error, and starts nothing.
func TestCompletionRefusalsAreOpenAIShaped(t *testing.T) {
	srv, tc, rdb := newTestServer(t, func(c *config.Config) { c.Auth.AllowAnonymous = false })
	user := func(extra string) string {
		return `{"model":"sluice-sim","messages":[{"role":"user","content":"hello"}]` + extra + `}`
	}
	cases := []struct {
		name, body string
		header     map[string]string
		status     int
		typ, code  string
		param      string
	}{
		{"malformed", `{"model":`, nil, 400, "invalid_request_error", "bad_json", ""},
		{"n", user(`,"n":0`), nil, 400, "invalid_request_error", "invalid_value", "n"},
		{"unknown model", `{"model":"gpt-5","messages":[{"role":"user","content":"s"}]}`, nil, 404, "not_found_error", "model_not_found", "model"},
		{"unsupported parameter", user(`,"logprobs":true`), nil, 400, "invalid_request_error", "unsupported_parameter", "logprobs"},
		{"no user message", `{"model":"sluice-rag","messages":[{"role":"system","content":"s"}]}`, nil, 400, "invalid_request_error", "no_user_message", "messages"},
		{"bad role", `{"model":"sluice-sim","messages":[{"role":"bot","content":"s"}]}`, nil, 400, "invalid_request_error", "bad_role", "messages[0].role"},
		{"zero max_tokens", user(`,"max_tokens":0`), nil, 400, "invalid_request_error", "bad_max_tokens", "max_tokens"},
		{"huge max_completion_tokens", user(`,"max_completion_tokens":999999`), nil, 400, "invalid_request_error", "bad_max_tokens", "max_tokens"},
		{"query too long", `{"model":"sluice-rag","messages":[{"role":"user","content":"` + strings.Repeat("a", 201) + `"}]}`, nil,
			413, "invalid_request_error", "query_too_long", "messages"},
		{"unknown kb in body", user(`,"kb":"nope"`), nil, 400, "invalid_request_error", "unknown_kb", "kb"},
		{"unknown kb in the alias", `{"model":"sluice-rag/nope","messages":[{"role":"user","content":"s"}]}`, nil, 400, "invalid_request_error", "unknown_kb", "kb"},
		{"unknown kb in header", user(""), map[string]string{"X-Sluice-KB": "nope"}, 400, "invalid_request_error", "unknown_kb", "kb"},
		{"no api key", user(""), map[string]string{"Authorization": ""}, 401, "authentication_error", "unauthorized", ""},
		{"bad api key", user(""), map[string]string{"Authorization": "Bearer nope"}, 401, "authentication_error", "unauthorized", ""},
		{"form body", `a=b`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "invalid_request_error", "unsupported_media_type", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assertOpenAIError(t, postCompletion(srv, c.body, c.header), c.status, c.typ, c.code, c.param)
		})
	}
	if n := tc.starts.Load(); n != 0 {
		t.Fatalf("%d workflows started by bad input", n)
	}
	if keys, _ := rdb.Keys(context.Background(), "t:"+t.Name()+"*").Result(); len(keys) != 0 {
		t.Fatalf("bad input wrote to redis: %v", keys)
	}
	// The native route keeps its own error shape.
	assertJSONError(t, post(srv, `{"query":""}`), 400, "empty_query")
}

// A rate-limited completion is a 429 with Retry-After, which the OpenAI
// clients honour when they retry.
func TestCompletionRateLimitedIs429(t *testing.T) {
	srv, tc, _ := newTestServer(t, limitedConfig)
	drain := door.RatesOf(srv.policy.Current().Limits.Tiers["standard"]).Buckets(limiter.Caller{Tenant: "acme"}, 5990)
	if d, err := limiterOf(srv).Reserve(context.Background(), "other", drain); err != nil || d.Status != limiter.Allowed {
		t.Fatalf("drain: %+v %v", d, err)
	}
	rec := postCompletion(srv, `{"model":"sluice-rag","messages":[{"role":"user","content":"how does a bucket refill?"}],"max_tokens":64}`, nil)
	assertOpenAIError(t, rec, 429, "rate_limit_error", "rate_limited", "")
	if rec.Header().Get("Retry-After") == "" || rec.Header().Get("X-RateLimit-Limit-Tokens") != "6000" {
		t.Fatalf("headers %v", rec.Header())
	}
	if tc.starts.Load() != 0 {
		t.Fatal("started")
	}
}

// A failed start is a 503 with Retry-After, refunded and cleaned up as on
// /v1/chat: both go through beginChat.
func TestCompletionStartFailureIs503AndRefunds(t *testing.T) {
	srv, tc, rdb := newTestServer(t, limitedConfig)
	for i := 0; i < 5; i++ {
		rec := postCompletion(srv, `{"model":"sluice-rag","messages":[{"role":"user","content":"hello"}],"max_tokens":1000,"stream":true}`, nil)
		assertOpenAIError(t, rec, 503, "server_error", "unavailable", "")
		if rec.Header().Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
	}
	if tc.starts.Load() != 5 {
		t.Fatalf("starts = %d", tc.starts.Load())
	}
	if keys, _ := rdb.Keys(context.Background(), "t:"+t.Name()+":ev:*").Result(); len(keys) != 0 {
		t.Fatalf("failed starts left event streams behind: %v", keys)
	}
	drain := door.RatesOf(srv.policy.Current().Limits.Tiers["standard"]).Buckets(limiter.Caller{Tenant: "acme"}, 5900)
	if d, _ := limiterOf(srv).Reserve(context.Background(), "probe", drain); d.Status != limiter.Allowed {
		t.Fatalf("bucket not refunded: %+v", d)
	}
}

// render feeds events to a chunk sink and returns the HTTP response a
// client would have read.
// The stream as OpenAI clients read it: only "data: " lines count, SSE
// comments are skipped, and "data: [DONE]" ends it. Each chunk is checked
// field by field against OpenAI's format.
// dataLines parses an event stream as OpenAI clients do and returns its
// data payloads before [DONE], and whether [DONE] came.
// The official client's own parser and accumulator read the stream.
// A rejection after the stream began is an error object, which the
// official client raises as an error; an empty answer still names the
// assistant.
// A non-streaming completion carries every field OpenAI's does, with
// logprobs and refusal null, and Sluice's extension after them.
// The official clients' first call lists the models: each model the pools
// serve, once; its errors take OpenAI's shape too. Asked by openai-go.
func TestListModels(t *testing.T) {
	srv, _, _ := newTestServer(t, func(c *config.Config) { c.Pools.Long.Model = "big-model" })
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("k-acme"), option.WithMaxRetries(0))
	page, err := client.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
		if m.Object != "model" || m.Created == 0 || m.OwnedBy == "" {
			t.Errorf("model %+v", m)
		}
	}
	// The backend models, then the RAG aliases of the kbs acme may read.
	if strings.Join(ids, ",") != "big-model,sluice-sim,sluice-rag,sluice-rag/sluice-docs" {
		t.Fatalf("models %v, want big-model, sluice-sim and the RAG aliases", ids)
	}
	bad := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("nope"), option.WithMaxRetries(0))
	_, err = bad.Models.List(context.Background())
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusUnauthorized || oe.Message == "" {
		t.Fatalf("unknown key: %v, want a 401 the client reads", err)
	}
}

// With n answers, each choice's tokens arrive as chunks of its index (the
// role on its first), each choice ends with its own finish chunk, and the
// official client's accumulator builds n choices; a non-streaming reply
// holds n choices.

// openAIErrorBody is what OpenAI clients read from an error response.
type openAIErrorBody struct {
	Error struct {
		Message *string `json:"message"`
		Type    *string `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}
