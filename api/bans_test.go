package api

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/iphash"
)

// An IP that floods one server is banned on every server sharing the
// Redis: every authenticated route answers 429 with the ban's remaining
// time as Retry-After, until an admin lifts it.
func TestFloodingIPIsBannedOnEveryServer(t *testing.T) {
	a, _, _ := newBannedServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" }, nil)
	b, _, _ := newBannedServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" }, nil)
	const flooder = "203.0.113.7"
	for i := range 5 {
		if rec := from(a, flooder, "", "GET", probe, ""); rec.Code != http.StatusNotFound {
			t.Fatalf("request %d: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	rec := from(b, flooder, "", "GET", probe, "")
	assertJSONError(t, rec, 429, "banned")
	if got := rec.Header().Get("Retry-After"); got != "3" {
		t.Fatalf("Retry-After %q, want 3 (the ban's duration)", got)
	}
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/chat", `{"query":"hi"}`},
		{"GET", "/v1/kb", ""},
		{"GET", "/v1/sessions/s1", ""},
		{"DELETE", probe, ""},
		{"GET", "/v1/admin/queue", ""}, // with no key at all: counted, and refused
	} {
		rec := from(a, flooder, "", r.method, r.path, r.body)
		assertJSONError(t, rec, 429, "banned")
		if s, _ := strconv.Atoi(rec.Header().Get("Retry-After")); s < 1 || s > 3 {
			t.Fatalf("%s %s: Retry-After %q", r.method, r.path, rec.Header().Get("Retry-After"))
		}
	}
	// The OpenAI endpoint refuses in OpenAI's shape.
	rec = from(b, flooder, "", "POST", "/v1/chat/completions", `{"model":"sluice-sim","messages":[{"role":"user","content":"hi"}]}`)
	var oai struct {
		Error struct{ Type, Code string }
	}
	if _ = json.Unmarshal(rec.Body.Bytes(), &oai); rec.Code != 429 || oai.Error.Code != "banned" || oai.Error.Type != "rate_limit_error" {
		t.Fatalf("OpenAI endpoint: %d %s", rec.Code, rec.Body)
	}
	// Another address is not concerned.
	if rec := from(b, "203.0.113.8", "", "GET", probe, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("another ip: %d %s", rec.Code, rec.Body)
	}

	// The list names the address by its keyed hash, never as it is.
	list := admin(b, "GET", "/v1/admin/bans", "root", "")
	hash := iphash.New(nil).Of(flooder)
	if list.Code != 200 || !strings.Contains(list.Body.String(), `"kind":"ip","value":"`+hash+`"`) || !strings.Contains(list.Body.String(), `"remaining_s":`) ||
		strings.Contains(list.Body.String(), flooder) {
		t.Fatalf("bans: %d %s", list.Code, list.Body)
	}
	assertJSONError(t, admin(b, "DELETE", "/v1/admin/bans/ip/not-an-ip", "root", ""), 400, "bad_ban")
	// A hash of the list's form names a client too.
	assertJSONError(t, admin(b, "DELETE", "/v1/admin/bans/ip/"+iphash.New(nil).Of("198.51.100.1"), "root", ""), 404, "not_found")
	assertJSONError(t, admin(b, "DELETE", "/v1/admin/bans/user/x", "root", ""), 400, "bad_ban")
	assertJSONError(t, admin(b, "DELETE", "/v1/admin/bans/ip/198.51.100.1", "root", ""), 404, "not_found")
	if rec := admin(b, "DELETE", "/v1/admin/bans/ip/"+flooder, "root", ""); rec.Code != 200 {
		t.Fatalf("lift: %d %s", rec.Code, rec.Body)
	}
	if rec := from(a, flooder, "", "GET", probe, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("after the lift: %d %s", rec.Code, rec.Body)
	}

	// Counted on the server that imposed the ban and on each that refused;
	// no label names the address.
	mrec := httptest.NewRecorder()
	a.Handler().ServeHTTP(mrec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`sluice_banned_requests_total{kind="ip"} 5`} {
		if !strings.Contains(mrec.Body.String(), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	mrec = httptest.NewRecorder()
	b.Handler().ServeHTTP(mrec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(mrec.Body.String(), `sluice_bans_total{kind="ip"} 1`) || strings.Contains(mrec.Body.String(), flooder) {
		t.Errorf("/metrics of b: want one ban and no address:\n%s", grepLines(mrec.Body.String(), "ban"))
	}
}

// A key that floods is banned from any address; its id names the ban.
func TestFloodingKeyIsBannedFromAnyAddress(t *testing.T) {
	srv, rdb, prefix := newBannedServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" }, nil)
	withManagedKeys(t, srv, rdb, prefix)
	k := createKey(t, srv, "root", `{"tenant":"acme"}`)
	for i := range 5 {
		authenticated(t, from(srv, "198.51.100."+strconv.Itoa(i+1), k.Key, "GET", probe, ""))
	}
	assertJSONError(t, from(srv, "198.51.100.99", k.Key, "GET", probe, ""), 429, "banned")
	list := admin(srv, "GET", "/v1/admin/bans", "root", "")
	if !strings.Contains(list.Body.String(), `"kind":"key","value":"`+k.ID+`"`) {
		t.Fatalf("bans: %s", list.Body)
	}
	// A guess at the key (its id with a wrong secret) counts against the
	// guesser's address, not the key.
	if rec := admin(srv, "DELETE", "/v1/admin/bans/key/"+k.ID, "root", ""); rec.Code != 200 {
		t.Fatalf("lift: %d %s", rec.Code, rec.Body)
	}
	guess := k.Key[:len(k.Key)-4] + "aaaa"
	for range 6 {
		from(srv, "198.51.100.200", guess, "GET", probe, "")
	}
	assertJSONError(t, from(srv, "198.51.100.200", guess, "GET", probe, ""), 429, "banned")
	authenticated(t, from(srv, "198.51.100.201", k.Key, "GET", probe, ""))
}

// Whatever happens to a key — created, used, guessed at, banned, revoked,
// used revoked — no log line and no metric holds it.
func TestLogsNeverHoldAPlainKey(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, rdb, prefix := newBannedServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" }, func(o *Options) { o.Logger = logger })
	withManagedKeys(t, srv, rdb, prefix)

	k := createKey(t, srv, "root", `{"tenant":"acme","scopes":["chat","ingest"]}`)
	secret := k.Key[strings.LastIndex(k.Key, "_")+1:]
	from(srv, "198.51.100.1", k.Key, "POST", "/v1/chat", `{"query":"hello","max_tokens":8}`)
	from(srv, "198.51.100.1", k.Key[:len(k.Key)-1]+"x", "GET", probe, "")
	for range 6 {
		from(srv, "198.51.100.2", k.Key, "GET", probe, "")
		from(srv, "198.51.100.3", "k-acme", "GET", probe, "")
	}
	admin(srv, "GET", "/v1/admin/keys", "root", "")
	admin(srv, "DELETE", "/v1/admin/keys/"+k.ID, "root", "")
	from(srv, "198.51.100.4", k.Key, "GET", probe, "")
	srv.keyCache.Forget(k.ID)

	out := logs.String()
	for _, want := range []string{"API key created", "banned for flooding", "API key revoked", k.ID} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	mrec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(mrec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for where, text := range map[string]string{"logs": out, "metrics": mrec.Body.String()} {
		for _, secretish := range []string{k.Key, secret, secret[:16], "k-acme", "root"} {
			if strings.Contains(text, secretish) {
				t.Errorf("%s hold %q:\n%s", where, secretish, grepLines(text, secretish))
			}
		}
	}
}

func grepLines(text, word string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, word) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
