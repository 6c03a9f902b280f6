package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/session"
)

// Keys of two users of it-acme and one of it-globex (main_test.go).
const (
	keyAlice = "k-it-alice"
	keyBob   = "k-it-bob"
	keyGus   = "k-it-gus"
)

// callAs sends a JSON request with an API key and returns the status and
// body.
func callAs(t *testing.T, ctx context.Context, key, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, stack.baseURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

func mustStatus(t *testing.T, ctx context.Context, want int, key, method, path, body string) string {
	t.Helper()
	got, raw := callAs(t, ctx, key, method, path, body)
	if got != want {
		t.Fatalf("%s %s %s: %d %s, want %d", key, method, path, got, raw, want)
	}
	return raw
}

// Two tenants each ingest a kb "it-faq" and ask it the same question: each
// is answered from its own documents, through its own retrieval and answer
// cache entries (same name, version and question, other tenant); another
// tenant's kb, session or request is not found, and a shared kb cannot be
// changed. Users of one tenant share its kbs, not their sessions.
func TestTenantsCannotTouchEachOther(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mustStatus(t, ctx, 200, keyAlice, "POST", "/v1/kb/it-faq/documents",
		`{"id":"acme-tides","title":"Tides","text":"Tides are caused mainly by the gravitational pull of the Moon on the oceans."}`)
	mustStatus(t, ctx, 200, keyGus, "POST", "/v1/kb/it-faq/documents",
		`{"id":"globex-tides","title":"Tides","text":"Tides are caused by the Moon and the Sun pulling on the oceans of the Earth."}`)
	mustStatus(t, ctx, 200, keyAlice, "POST", "/v1/kb/it-private/documents", `{"id":"plans","text":"Acme plans to sell anvils."}`)

	const q = `{"query":"What causes the tides?","kb":"it-faq","max_tokens":1000}`
	_, a1, aliceReq := answerAs(t, ctx, keyAlice, q)
	if a1.Cached || !slices.Equal(a1.Sources, []string{"acme-tides"}) {
		t.Fatalf("alice's first answer %+v", a1)
	}
	if _, a2, _ := answerAs(t, ctx, keyBob, q); !a2.Cached || !slices.Equal(a2.Sources, a1.Sources) {
		t.Fatalf("bob, of the same tenant, misses its answer cache: %+v", a2)
	}
	if _, g1, _ := answerAs(t, ctx, keyGus, q); g1.Cached || g1.KBVersion != a1.KBVersion || !slices.Equal(g1.Sources, []string{"globex-tides"}) {
		t.Fatalf("globex's answer %+v: want its own document, not acme's cached answer", g1)
	}

	// Another tenant's kb does not exist for it.
	mustStatus(t, ctx, 400, keyGus, "POST", "/v1/chat", `{"query":"What are the plans?","kb":"it-private"}`)
	mustStatus(t, ctx, 404, keyGus, "GET", "/v1/kb/it-private", "")
	mustStatus(t, ctx, 404, keyGus, "DELETE", "/v1/kb/it-private/documents/plans", "")
	mustStatus(t, ctx, 200, keyBob, "GET", "/v1/kb/it-private", "")
	if raw := mustStatus(t, ctx, 200, keyGus, "GET", "/v1/kb", ""); strings.Contains(raw, "it-private") || !strings.Contains(raw, "it-faq") {
		t.Fatalf("globex lists %s", raw)
	}
	// Shared kbs are read-only to tenants.
	mustStatus(t, ctx, 403, keyGus, "POST", "/v1/kb/sluice-docs/documents", `{"id":"x","text":"Globex was here."}`)
	mustStatus(t, ctx, 200, keyGus, "GET", "/v1/kb/sluice-docs", "")

	// Alice's request is hers alone.
	for _, key := range []string{keyBob, keyGus} {
		mustStatus(t, ctx, 404, key, "GET", "/v1/requests/"+aliceReq, "")
		mustStatus(t, ctx, 404, key, "GET", "/v1/requests/"+aliceReq+"/events", "")
		mustStatus(t, ctx, 404, key, "DELETE", "/v1/requests/"+aliceReq, "")
	}
	mustStatus(t, ctx, 200, keyAlice, "GET", "/v1/requests/"+aliceReq, "")

	// So is her session: bob naming its id continues a session of his own.
	answerAs(t, ctx, keyAlice, `{"query":"How does a token bucket refill?","session_id":"it-tenancy","max_tokens":8}`)
	for _, key := range []string{keyBob, keyGus} {
		mustStatus(t, ctx, 404, key, "GET", "/v1/sessions/it-tenancy", "")
		mustStatus(t, ctx, 404, key, "DELETE", "/v1/sessions/it-tenancy", "")
	}
	answerAs(t, ctx, keyBob, `{"query":"What is a waiting room?","session_id":"it-tenancy","max_tokens":8}`)
	for key, want := range map[string]string{keyAlice: "How does a token bucket refill?", keyBob: "What is a waiting room?"} {
		var got struct {
			Turns []session.Turn `json:"turns"`
		}
		raw := mustStatus(t, ctx, 200, key, "GET", "/v1/sessions/it-tenancy", "")
		if err := json.Unmarshal([]byte(raw), &got); err != nil || len(got.Turns) != 1 || got.Turns[0].Query != want {
			t.Fatalf("%s's session: %s (%v)", key, raw, err)
		}
	}
	mustStatus(t, ctx, 204, keyAlice, "DELETE", "/v1/sessions/it-tenancy", "")
	mustStatus(t, ctx, 200, keyBob, "GET", "/v1/sessions/it-tenancy", "")
	assertPoolsIdle(t)
}
