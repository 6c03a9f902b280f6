package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/keys"
)

// adminIP is the address httptest requests come from; the ban tests
// exempt it so that their admin calls do not ban it.
const adminIP = "192.0.2.1"

// sharedPrefix is the key space of managed keys and bans that every
// server of one test shares, emptied of what an earlier run left.
func sharedPrefix(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	prefix := "t:" + t.Name() + ":auth:"
	if old, _ := rdb.Keys(context.Background(), prefix+"*").Result(); len(old) > 0 {
		rdb.Del(context.Background(), old...)
	}
	return prefix
}

// withManagedKeys gives srv a key cache over prefix, running (subscribed)
// for the rest of the test, as the process (package app) runs it.
func withManagedKeys(t *testing.T, srv *Server, rdb *redis.Client, prefix string) {
	t.Helper()
	srv.keyCache = keys.NewCache(keys.NewStore(rdb, prefix), keys.CacheOptions{TTL: time.Hour, Logger: srv.logger})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.keyCache.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the key cache's subscription", srv.keyCache.Live)
}

// testBanGrace is the test guards' ban.Options.Grace: short, so that a
// test need not wait a second before a client ignores its Retry-After.
const testBanGrace = 50 * time.Millisecond

// newBannedServer is a test server with a ban guard over the test's
// shared prefix (returned): more than 5 strikes in 10 s ban for 3 s; the
// admin's address is exempt. with, if set, changes its options too.
func newBannedServer(t *testing.T, mod func(*config.Config), with func(*Options)) (*Server, *redis.Client, string) {
	t.Helper()
	var prefix string
	srv, _, rdb := newTestServerWith(t, func(c *config.Config) {
		if mod != nil {
			mod(c)
		}
		c.Limits.Ban = config.Ban{Enabled: true, Threshold: 5, Window: 10 * time.Second, Duration: 3 * time.Second}
	}, func(rdb *redis.Client, o *Options) {
		prefix = sharedPrefix(t, rdb)
		g, err := ban.New(rdb, ban.Options{KeyPrefix: prefix, Threshold: 5, Window: 10 * time.Second, Duration: 3 * time.Second,
			Grace: testBanGrace, Exempt: []netip.Prefix{netip.MustParsePrefix(adminIP + "/32")}})
		if err != nil {
			t.Fatal(err)
		}
		o.Bans = g
		if with != nil {
			with(o)
		}
	})
	return srv, rdb, prefix
}

// from sends a request with key ("" for none) from the address ip.
func from(srv *Server, ip, key, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = ip + ":40000"
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}

// probe is a route that authenticates and then answers 404 for a request
// that is not the caller's: any other status is authentication's.
const probe = "/v1/requests/chat-01JABCDEFGHJKMNPQRSTVWXYZ0"

func authenticated(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status %d, body %s: want the key accepted (404 from the route)", rec.Code, rec.Body)
	}
}

type createdKeyBody struct {
	ID         string    `json:"id"`
	Key        string    `json:"key"`
	Masked     string    `json:"masked"`
	Tenant     string    `json:"tenant"`
	Scopes     []string  `json:"scopes"`
	LastUsedAt time.Time `json:"last_used_at"`
	Revoked    bool      `json:"revoked"`
}

func createKey(t *testing.T, srv *Server, adminKey, body string) createdKeyBody {
	t.Helper()
	rec := admin(srv, "POST", "/v1/admin/keys", adminKey, body)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create key: %d %s", rec.Code, rec.Body)
	}
	var k createdKeyBody
	if err := json.Unmarshal(rec.Body.Bytes(), &k); err != nil {
		t.Fatal(err)
	}
	return k
}

func listKeys(t *testing.T, srv *Server, path string) []createdKeyBody {
	t.Helper()
	rec := admin(srv, "GET", path, "root", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("list keys: %d %s", rec.Code, rec.Body)
	}
	var out struct{ Keys []createdKeyBody }
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	return out.Keys
}

// Create a key (shown once), use it, list it masked with its last use,
// revoke it; bad input is a 4xx.
func TestManagedKeyLifecycle(t *testing.T) {
	srv, _, rdb := newTestServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	withManagedKeys(t, srv, rdb, sharedPrefix(t, rdb))
	k := createKey(t, srv, "root", `{"tenant":"acme","user":"alice","tier":"standard","scopes":["chat","ingest"]}`)
	if !strings.HasPrefix(k.Key, "sk_"+k.ID+"_") || k.Masked != keys.Mask(k.ID) || k.Tenant != "acme" || strings.Join(k.Scopes, ",") != "chat,ingest" {
		t.Fatalf("created %+v", k)
	}
	other := createKey(t, srv, "root", `{"tenant":"globex"}`)
	if strings.Join(other.Scopes, ",") != "chat" {
		t.Fatalf("default scopes %v, want chat", other.Scopes)
	}
	authenticated(t, from(srv, adminIP, k.Key, "GET", probe, ""))

	waitFor(t, "the key's last use", func() bool {
		list := listKeys(t, srv, "/v1/admin/keys?tenant=acme")
		return len(list) == 1 && !list[0].LastUsedAt.IsZero()
	})
	rec := admin(srv, "GET", "/v1/admin/keys", "root", "")
	if strings.Contains(rec.Body.String(), k.Key) || strings.Contains(rec.Body.String(), `"key"`) {
		t.Fatalf("the list shows a key: %s", rec.Body)
	}
	if n := len(listKeys(t, srv, "/v1/admin/keys")); n != 2 {
		t.Fatalf("%d keys listed, want 2", n)
	}

	if rec := admin(srv, "DELETE", "/v1/admin/keys/"+k.ID, "root", ""); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"revoked":true`) {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	assertJSONError(t, from(srv, adminIP, k.Key, "GET", probe, ""), 401, "unauthorized")
	if list := listKeys(t, srv, "/v1/admin/keys?tenant=acme"); !list[0].Revoked {
		t.Fatalf("listed after revoke: %+v", list)
	}

	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/admin/keys", `{"tenant":"acme","scopes":["root"]}`, 400, "bad_scopes"},
		{"POST", "/v1/admin/keys", `{"tenant":"acme","scopes":["chat","chat"]}`, 400, "bad_scopes"},
		{"POST", "/v1/admin/keys", `{"tenant":"acme","tier":"gold"}`, 400, "unknown_tier"},
		{"POST", "/v1/admin/keys", `{"tenant":""}`, 400, "bad_key"},
		{"POST", "/v1/admin/keys", `{"tenant":"a b"}`, 400, "bad_key"},
		{"POST", "/v1/admin/keys", `{"tenant":"acme","expires":"never"}`, 400, "bad_json"},
		{"POST", "/v1/admin/keys", `[]`, 400, "bad_json"},
		{"DELETE", "/v1/admin/keys/nope", "", 400, "bad_key_id"},
		{"DELETE", "/v1/admin/keys/aaaaaaaaaaaa", "", 404, "not_found"},
		{"DELETE", "/v1/admin/bans/user/x", "", 404, "not_found"}, // bans are off here
	} {
		t.Run(tc.method+" "+tc.body, func(t *testing.T) {
			assertJSONError(t, admin(srv, tc.method, tc.path, "root", tc.body), tc.status, tc.code)
		})
	}
}

// A chat-only key cannot reach the admin API; a key with the admin scope,
// managed or configured, can, and may create keys.
func TestAdminScopeGuardsTheAdminAPI(t *testing.T) {
	opsHash := keys.Hash("k-ops")
	srv, _, rdb := newTestServer(t, func(c *config.Config) {
		c.Auth.AdminKeySHA256 = keys.Hash("root")
		c.Auth.APIKeys = append(c.Auth.APIKeys, config.APIKey{KeySHA256: opsHash, Tenant: "ops", Scopes: []string{"admin"}})
	})
	withManagedKeys(t, srv, rdb, sharedPrefix(t, rdb))
	chat := createKey(t, srv, "root", `{"tenant":"acme","scopes":["chat"]}`)
	boss := createKey(t, srv, "root", `{"tenant":"acme","scopes":["admin"]}`)

	for _, path := range []string{"/v1/admin/keys", "/v1/admin/limits", "/v1/admin/queue"} {
		assertJSONError(t, admin(srv, "GET", path, chat.Key, ""), 403, "forbidden")
		assertJSONError(t, admin(srv, "GET", path, "k-acme", ""), 403, "forbidden")
		assertJSONError(t, admin(srv, "GET", path, "sk_nope", ""), 401, "unauthorized")
		assertJSONError(t, admin(srv, "GET", path, "", ""), 401, "unauthorized")
	}
	assertJSONError(t, admin(srv, "POST", "/v1/admin/keys", chat.Key, `{"tenant":"acme","scopes":["admin"]}`), 403, "forbidden")
	createKey(t, srv, boss.Key, `{"tenant":"globex"}`)
	createKey(t, srv, "k-ops", `{"tenant":"globex"}`)
	if rec := admin(srv, "GET", "/v1/admin/limits", boss.Key, ""); rec.Code != 200 {
		t.Fatalf("admin key on limits: %d %s", rec.Code, rec.Body)
	}
	// An admin-only key is not a chat key.
	if rec := admin(srv, "DELETE", "/v1/admin/keys/"+boss.ID, "root", ""); rec.Code != 200 {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	assertJSONError(t, admin(srv, "GET", "/v1/admin/keys", boss.Key, ""), 401, "unauthorized")
}

// Two API servers share one Redis: a key revoked through one stops
// working on the other within a second, though the other had it cached.
func TestRevokedKeyStopsOnAnotherServerWithinASecond(t *testing.T) {
	a, _, rdbA := newTestServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	b, _, rdbB := newTestServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	prefix := sharedPrefix(t, rdbA)
	withManagedKeys(t, a, rdbA, prefix)
	withManagedKeys(t, b, rdbB, prefix)
	k := createKey(t, a, "root", `{"tenant":"acme"}`)
	authenticated(t, from(b, adminIP, k.Key, "GET", probe, ""))
	// b now answers from its cache: not even Redis losing the key's
	// record would stop it, only the revocation's message.
	if rec := admin(a, "DELETE", "/v1/admin/keys/"+k.ID, "root", ""); rec.Code != 200 {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	revoked := time.Now()
	for {
		rec := from(b, adminIP, k.Key, "GET", probe, "")
		if rec.Code == http.StatusUnauthorized {
			break
		}
		if time.Since(revoked) > time.Second {
			t.Fatalf("server b still accepts the key a second after it was revoked on a: %d", rec.Code)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("revocation seen by the other server after %v", time.Since(revoked))
}
