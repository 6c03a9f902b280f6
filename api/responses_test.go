package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/limiter"
)

func postResponse(srv *Server, body string, header map[string]string) *httptest.ResponseRecorder {
	return postOpenAI(srv, "/v1/responses", body, header)
}

// Every refusal of a Responses request is an HTTP status with an
// OpenAI-shaped error naming the field, and starts and writes nothing.
func TestResponseRefusalsAreOpenAIShaped(t *testing.T) {
	srv, tc, rdb := newTestServer(t, func(c *config.Config) { c.Auth.AllowAnonymous = false })
	cases := []struct {
		name, body string
		header     map[string]string
		status     int
		typ, code  string
		param      string
	}{
		{"malformed", `{"input":`, nil, 400, "invalid_request_error", "bad_json", ""},
		{"no input", `{"model":"sluice-sim"}`, nil, 400, "invalid_request_error", "missing_input", "input"},
		{"stored, with the store off", `{"model":"sluice-sim","input":"hi","store":true}`, nil, 400, "invalid_request_error", "storage_disabled", "store"},
		{"continued, with the store off", `{"model":"sluice-sim","input":"hi","previous_response_id":"resp_1"}`, nil, 400, "invalid_request_error", "storage_disabled", "previous_response_id"},
		{"background, with the store off", `{"model":"sluice-sim","input":"hi","background":true}`, nil, 400, "invalid_request_error", "storage_disabled", "background"},
		{"background, not stored", `{"model":"sluice-sim","input":"hi","background":true,"store":false}`, nil, 400, "invalid_request_error", "invalid_value", "store"},
		{"unknown model", `{"model":"gpt-5","input":"hi"}`, nil, 404, "not_found_error", "model_not_found", "model"},
		{"zero max_output_tokens", `{"model":"sluice-sim","input":"hi","max_output_tokens":0}`, nil, 400, "invalid_request_error", "bad_max_tokens", "max_output_tokens"},
		{"query too long", `{"model":"sluice-rag","input":"` + strings.Repeat("a", 201) + `"}`, nil, 413, "invalid_request_error", "query_too_long", "input"},
		{"unknown kb", `{"model":"sluice-rag/nope","input":"hi"}`, nil, 400, "invalid_request_error", "unknown_kb", "kb"},
		{"bad item", `{"model":"sluice-sim","input":[{"type":"reasoning"}]}`, nil, 400, "invalid_request_error", "unsupported_value", "input[0].type"},
		{"no api key", `{"model":"sluice-sim","input":"hi"}`, map[string]string{"Authorization": ""}, 401, "authentication_error", "unauthorized", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assertOpenAIError(t, postResponse(srv, c.body, c.header), c.status, c.typ, c.code, c.param)
		})
	}
	if n := tc.starts.Load(); n != 0 {
		t.Fatalf("%d workflows started by bad input", n)
	}
	if keys, _ := rdb.Keys(context.Background(), "t:"+t.Name()+"*").Result(); len(keys) != 0 {
		t.Fatalf("bad input wrote to redis: %v", keys)
	}
}

// A rate-limited response is a 429 with Retry-After, as a completion is.
func TestResponseRateLimitedIs429(t *testing.T) {
	srv, tc, _ := newTestServer(t, limitedConfig)
	drain := door.RatesOf(srv.policy.Current().Limits.Tiers["standard"]).Buckets(limiter.Caller{Tenant: "acme"}, 5990)
	if d, err := limiterOf(srv).Reserve(context.Background(), "other", drain); err != nil || d.Status != limiter.Allowed {
		t.Fatalf("drain: %+v %v", d, err)
	}
	rec := postResponse(srv, `{"model":"sluice-rag","input":"how does a bucket refill?","max_output_tokens":64}`, nil)
	assertOpenAIError(t, rec, 429, "rate_limit_error", "rate_limited", "")
	if rec.Header().Get("Retry-After") == "" || rec.Header().Get("X-RateLimit-Limit-Tokens") != "6000" {
		t.Fatalf("headers %v", rec.Header())
	}
	if tc.starts.Load() != 0 {
		t.Fatal("started")
	}
}

// With responses.store off, a stored response is nowhere: 404 in
// OpenAI's shape.
func TestStoredResponseWithTheStoreOffIs404(t *testing.T) {
	srv, _, _ := newTestServer(t, nil)
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, ""}, {http.MethodDelete, ""}, {http.MethodPost, "/cancel"}, {http.MethodGet, "?stream=true&starting_after=3"},
	} {
		req := httptest.NewRequest(r.method, "/v1/responses/resp_01HZY3Q9V7W8X2K4M6N8P0R2T4"+r.path, nil)
		req.Header.Set("Authorization", "Bearer k-acme")
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		assertOpenAIError(t, rec, 404, "not_found_error", "not_found", "")
	}
}
