package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
)

// Keys of two users of acme and one of globex, each allowed to ingest.
const (
	keyAlice = "k-alice" // acme
	keyBob   = "k-bob"   // acme
	keyGus   = "k-gus"   // globex
)

func tenantsConfig(c *config.Config) {
	both := []string{string(keys.ScopeChat), string(keys.ScopeIngest)}
	c.Auth.APIKeys = []config.APIKey{
		{Key: keyAlice, Tenant: "acme", User: "alice", Scopes: both},
		{Key: keyBob, Tenant: "acme", User: "bob", Scopes: both},
		{Key: keyGus, Tenant: "globex", User: "gus", Scopes: both},
	}
}

// as sends body as JSON with an API key ("" for none) and the client's
// context for up to a second.
func as(srv *Server, key, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req.WithContext(ctx))
	return rec
}

func docIDs(t *testing.T, rec *httptest.ResponseRecorder) []string {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("get kb: %d %s", rec.Code, rec.Body)
	}
	var v struct {
		KB        string `json:"kb"`
		Shared    bool   `json:"shared"`
		Documents []struct {
			ID string `json:"id"`
		} `json:"documents"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range v.Documents {
		ids = append(ids, d.ID)
	}
	return ids
}

// Two tenants each have a kb "docs" of their own; neither can read,
// change or delete the other's, nor learn that it exists. Users of one
// tenant share its kbs.
func TestKBsBelongToTheirTenant(t *testing.T) {
	srv := newKBServer(t, tenantsConfig)
	for key, doc := range map[string]string{keyAlice: "otters", keyGus: "bread"} {
		rec := as(srv, key, "POST", "/v1/kb/docs/documents", `{"id":"`+doc+`","text":"Some text about `+doc+`."}`)
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"kb":"docs","version":1`) {
			t.Fatalf("%s ingests into its own docs: %d %s", key, rec.Code, rec.Body)
		}
	}
	if rec := as(srv, keyAlice, "POST", "/v1/kb/secret/documents", `{"id":"plans","text":"Acme's plans."}`); rec.Code != 200 {
		t.Fatalf("post secret: %d %s", rec.Code, rec.Body)
	}
	for key, want := range map[string][]string{keyAlice: {"otters"}, keyBob: {"otters"}, keyGus: {"bread"}} {
		if got := docIDs(t, as(srv, key, "GET", "/v1/kb/docs", "")); !slices.Equal(got, want) {
			t.Errorf("%s sees docs %v, want %v", key, got, want)
		}
	}
	// Another tenant's kb and documents are not found, whatever the verb.
	assertJSONError(t, as(srv, keyGus, "GET", "/v1/kb/secret", ""), 404, "not_found")
	assertJSONError(t, as(srv, keyGus, "DELETE", "/v1/kb/docs/documents/otters", ""), 404, "not_found")
	assertJSONError(t, as(srv, keyGus, "DELETE", "/v1/kb/secret/documents/plans", ""), 404, "not_found")
	assertJSONError(t, as(srv, "", "GET", "/v1/kb/secret", ""), 404, "not_found")
	assertJSONError(t, as(srv, keyGus, "POST", "/v1/chat", `{"query":"plans?","kb":"secret"}`), 400, "unknown_kb")
	// A write naming it makes the writer's own kb, untouched by acme's.
	if rec := as(srv, keyGus, "POST", "/v1/kb/secret/documents", `{"id":"plans","text":"Globex's plans."}`); rec.Code != 200 ||
		!strings.Contains(rec.Body.String(), `"version":1`) {
		t.Fatalf("globex's own secret: %d %s", rec.Code, rec.Body)
	}
	if v, _ := srv.kbStore.Version(context.Background(), kbref.Own("acme", "secret").Key()); v != 1 {
		t.Fatalf("globex's write moved acme's kb to version %d", v)
	}
	// Users of one tenant share its kbs: bob deletes what alice put.
	if rec := as(srv, keyBob, "DELETE", "/v1/kb/secret/documents/plans", ""); rec.Code != 200 {
		t.Fatalf("bob deletes acme's document: %d %s", rec.Code, rec.Body)
	}
	if got := docIDs(t, as(srv, keyGus, "GET", "/v1/kb/secret", "")); !slices.Equal(got, []string{"plans"}) {
		t.Fatalf("acme's delete reached globex's kb: %v", got)
	}
	// Listing shows the caller's own kbs and the shared ones.
	for key, want := range map[string]string{
		keyAlice: `{"kbs":["docs","secret","sluice-docs"],"shared":["sluice-docs"]}`,
		keyGus:   `{"kbs":["docs","secret","sluice-docs"],"shared":["sluice-docs"]}`,
		"":       `{"kbs":["sluice-docs"],"shared":["sluice-docs"]}`,
	} {
		if rec := as(srv, key, "GET", "/v1/kb", ""); rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != want {
			t.Errorf("%q lists %d %s, want %s", key, rec.Code, rec.Body, want)
		}
	}
}

// A chat request names its kb by name; the door resolves it for the
// caller and the workflow input carries the owner.
func TestChatCarriesTheResolvedKB(t *testing.T) {
	srv := newKBServer(t, tenantsConfig)
	tc := srv.temporal.(*countingClient)
	if rec := as(srv, keyAlice, "POST", "/v1/kb/docs/documents", `{"id":"a","text":"alpha"}`); rec.Code != 200 {
		t.Fatalf("post: %d %s", rec.Code, rec.Body)
	}
	for _, key := range []string{keyBob, keyAlice} {
		assertJSONError(t, as(srv, key, "POST", "/v1/chat", `{"query":"alpha?","kb":"docs"}`), 503, "unavailable")
	}
	assertJSONError(t, as(srv, keyGus, "POST", "/v1/chat", `{"query":"alpha?","kb":"docs"}`), 400, "unknown_kb")
	assertJSONError(t, as(srv, keyGus, "POST", "/v1/chat", `{"query":"what is sluice?"}`), 503, "unavailable")
	tc.mu.Lock()
	defer tc.mu.Unlock()
	var got []kbref.Ref
	for _, in := range tc.inputs {
		got = append(got, in.KBRef())
	}
	want := []kbref.Ref{kbref.Own("acme", "docs"), kbref.Own("acme", "docs"), kbref.Shared("sluice-docs")}
	if !slices.Equal(got, want) {
		t.Fatalf("workflow inputs name kbs %v, want %v", got, want)
	}
}

// A shared kb is every tenant's to read and no tenant's to change (403:
// its existence is no secret); its name cannot be taken for a kb of one's
// own. A key without the ingest scope changes nothing.
func TestSharedKBsAreReadOnly(t *testing.T) {
	srv := newKBServer(t, tenantsConfig)
	if _, err := srv.ingester.Put(context.Background(), "sluice-docs", []ingest.Document{{ID: "limits", Text: "Token buckets."}}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{keyAlice, keyGus, ""} {
		rec := as(srv, key, "GET", "/v1/kb/sluice-docs", "")
		if got := docIDs(t, rec); !slices.Equal(got, []string{"limits"}) || !strings.Contains(rec.Body.String(), `"shared":true`) {
			t.Errorf("%q reads the shared kb: %s", key, rec.Body)
		}
		assertJSONError(t, as(srv, key, "POST", "/v1/kb/sluice-docs/documents", `{"id":"x","text":"mine now"}`), 403, "kb_read_only")
		assertJSONError(t, as(srv, key, "DELETE", "/v1/kb/sluice-docs/documents/limits", ""), 403, "kb_read_only")
	}
	if v, _ := srv.kbStore.Version(context.Background(), "sluice-docs"); v != 1 {
		t.Fatalf("shared kb at version %d after refused writes", v)
	}
	reader := door.Caller{Tenant: "acme", User: "carol", Scopes: keys.Scopes{keys.ScopeChat}}
	for _, name := range []string{"docs", "sluice-docs"} {
		_, err := srv.door.KBs().Writable(reader, name)
		var ae *refusal.Error
		if !errors.As(err, &ae) || ae.Class != refusal.Forbidden || ae.Code != "missing_scope" {
			t.Errorf("a chat-only key writing %s: %v, want 403 missing_scope", name, err)
		}
	}
}

// Sessions belong to a user of a tenant: another user of the same tenant,
// or another tenant, naming the same id finds nothing (404) and cannot
// forget it.
func TestSessionsBelongToTheirUser(t *testing.T) {
	srv, _, _ := newTestServerWith(t, tenantsConfig, withSessions(t))
	sessions := srv.sessions
	alice := session.Owner{Tenant: "acme", User: "alice"}
	if err := sessions.Append(context.Background(), alice, "s1", session.Turn{RequestID: door.NewRequestID(), Query: "private question",
		Outcome: request.OutcomeDone, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{keyBob, keyGus, ""} {
		assertJSONError(t, as(srv, key, "GET", "/v1/sessions/s1", ""), 404, "session_not_found")
		assertJSONError(t, as(srv, key, "DELETE", "/v1/sessions/s1", ""), 404, "session_not_found")
	}
	if rec := as(srv, keyAlice, "GET", "/v1/sessions/s1", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), "private question") {
		t.Fatalf("alice reads her session: %d %s", rec.Code, rec.Body)
	}
	if rec := as(srv, keyAlice, "DELETE", "/v1/sessions/s1", ""); rec.Code != http.StatusNoContent {
		t.Fatalf("alice forgets her session: %d %s", rec.Code, rec.Body)
	}
}

// A request is its sender's: another user of its tenant, another tenant
// or an anonymous caller gets 404 for its status, its events and a cancel.
func TestRequestsBelongToTheirSender(t *testing.T) {
	srv, _, _ := newTestServer(t, tenantsConfig)
	ctx := context.Background()
	id := door.NewRequestID()
	if _, err := srv.events.Append(ctx, id, events.TypeAccepted, events.Accepted{RequestID: id, Tenant: "acme", User: "alice", KB: "docs"}); err != nil {
		t.Fatal(err)
	}
	done, _, err := srv.events.AppendFinal(ctx, id, events.TypeDone, events.Done{RequestID: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{keyBob, keyGus, ""} {
		assertJSONError(t, as(srv, key, "GET", "/v1/requests/"+id, ""), 404, "not_found")
		assertJSONError(t, as(srv, key, "GET", "/v1/requests/"+id+"/events", ""), 404, "not_found")
		assertJSONError(t, as(srv, key, "DELETE", "/v1/requests/"+id, ""), 404, "not_found")
	}
	// Alice is let in: she already has the last event, so 204 tells her
	// client to stop.
	if rec := as(srv, keyAlice, "GET", "/v1/requests/"+id+"/events?last_event_id="+done, ""); rec.Code != http.StatusNoContent {
		t.Fatalf("alice reads her request's events: %d %s", rec.Code, rec.Body)
	}
	// Hers to cancel too: it has finished.
	assertJSONError(t, as(srv, keyAlice, "DELETE", "/v1/requests/"+id, ""), 409, "already_finished")
}

// A key made only to ingest cannot be spent on answers: chat, chat
// completions and embeddings are refused 403, before anything starts.
func TestIngestOnlyKeyCannotAskForAnswers(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.Auth.APIKeys = []config.APIKey{{Key: "k-ingest", Tenant: "acme", Scopes: []string{string(keys.ScopeIngest)}}}
	})
	for path, body := range map[string]string{
		"/v1/chat":             `{"query":"hi"}`,
		"/v1/chat/completions": `{"model":"sluice-sim","messages":[{"role":"user","content":"hi"}]}`,
		"/v1/embeddings":       `{"model":"local-hash-v1","input":"hi"}`,
	} {
		rec := as(srv, "k-ingest", http.MethodPost, path, body)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "missing_scope") {
			t.Errorf("%s with an ingest-only key: %d %s, want 403 missing_scope", path, rec.Code, rec.Body)
		}
	}
	if tc.starts.Load() != 0 {
		t.Fatal("a request started")
	}
}
