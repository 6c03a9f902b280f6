package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
)

// Every JSON route refuses a body that is not declared JSON with 415, in
// its route's error shape, before reading it.
func TestJSONBodiesNeedContentType(t *testing.T) {
	srv := newKBServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	routes := []struct{ method, path, auth, body string }{
		{"POST", "/v1/chat", "Bearer k-acme", `{"query":"hi"}`},
		{"POST", "/v1/chat/completions", "Bearer k-acme", `{"messages":[{"role":"user","content":"hi"}]}`},
		{"POST", "/v1/kb/facts/documents", "Bearer k-acme", `{"id":"a","text":"x"}`},
		{"PUT", "/v1/admin/limits", "Bearer root", `{}`},
	}
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
		"application/json; charset=iso-8859-1", "application/jsonp", "application/json;;"} {
		for _, r := range routes {
			t.Run(fmt.Sprintf("%s %s %q", r.method, r.path, ct), func(t *testing.T) {
				req, _ := http.NewRequest(r.method, r.path, strings.NewReader(r.body))
				req.Header.Set("Authorization", r.auth)
				if ct != "" {
					req.Header.Set("Content-Type", ct)
				}
				rec := recorded(srv, req)
				if r.path == "/v1/chat/completions" {
					assertOpenAIError(t, rec, 415, "invalid_request_error", "unsupported_media_type", "")
					return
				}
				assertJSONError(t, rec, http.StatusUnsupportedMediaType, "unsupported_media_type")
			})
		}
	}
	// A charset parameter naming UTF-8 is fine: the request gets past the
	// check (to a kb that does not exist yet).
	req, _ := http.NewRequest("POST", "/v1/chat", strings.NewReader(`{"query":"hi","kb":"nope"}`))
	req.Header.Set("Authorization", "Bearer k-acme")
	req.Header.Set("Content-Type", "Application/JSON; charset=UTF-8")
	assertJSONError(t, recorded(srv, req), 400, "unknown_kb")
}

// Invalid UTF-8 is refused with 400 naming the field, on every JSON route;
// it never reaches a decoder that would quietly turn it into U+FFFD.
func TestInvalidUTF8IsRefusedNamingTheField(t *testing.T) {
	srv := newKBServer(t, nil)
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/chat", "{\"query\":\"caf\xe9\"}", "query"},
		{"/v1/chat", "{\"query\":\"hi\",\"session_id\":\"s\xff1\"}", "session_id"},
		{"/v1/chat", "{\"query\":\"hi\",\"kb\":\"\xc0\xaf\"}", "kb"},
		{"/v1/chat", "{\"qu\xffery\":\"hi\"}", "a field name"},
		{"/v1/chat", `{"query":"half a pair: \ud83d"}`, "query"},
		{"/v1/kb/facts/documents", "{\"id\":\"a\",\"text\":\"\xed\xa0\x80\"}", "text"},
		{"/v1/kb/facts/documents", "{\"id\":\"a\",\"title\":\"\xfe\",\"text\":\"x\"}", "title"},
		{"/v1/kb/facts/documents", "{\"id\":\"\xff\",\"text\":\"x\"}", "id"},
		{"/v1/kb/facts/documents", "{\"documents\":[{\"id\":\"a\",\"text\":\"x\"},{\"id\":\"b\",\"text\":\"\xff\"}]}", "documents[1].text"},
		{"/v1/kb/facts/documents", "{\"id\":\"a\",\"text\":\"x\",\"metadata\":{\"k\xff\":\"v\"}}", "a field name in metadata"},
	} {
		t.Run(tc.field, func(t *testing.T) {
			rec := call(srv, "POST", tc.path, tc.body)
			assertJSONError(t, rec, 400, "bad_utf8")
			if want := tc.field + " is not valid UTF-8"; !strings.Contains(rec.Body.String(), want) {
				t.Fatalf("body %s does not say %q", rec.Body, want)
			}
		})
	}
	for _, tc := range []struct{ body, param string }{
		{"{\"messages\":[{\"role\":\"system\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},{\"role\":\"user\",\"content\":\"\xff\"}]}", "messages[2].content"},
		{"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"\xff\"}]}]}", "messages[0].content[1].text"},
		{"{\"model\":\"\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "model"},
	} {
		t.Run(tc.param, func(t *testing.T) {
			assertOpenAIError(t, postCompletion(srv, tc.body, nil), 400, "invalid_request_error", "bad_utf8", tc.param)
		})
	}
}

func recorded(srv *Server, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}
