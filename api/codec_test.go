package api

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/iphash"
)

// testCodecKey is a test key, not a secret.
var testCodecKey = []byte("sluice-test-codec-key-NOT-SECRET")

// testKeyring is the keyring of withCodec's key, which the test server
// serves when its config enables the codec.
func testKeyring() (*codec.Keyring, error) {
	return codec.NewKeyring("t1", codec.Key{ID: "t1", Secret: testCodecKey})
}

func withCodec(origins ...string) func(*config.Config) {
	return func(c *config.Config) {
		c.Auth.AdminKey = "root"
		c.Codec = config.Codec{Enabled: true, ActiveKey: "t1", Keys: []config.CodecKey{{ID: "t1", Secret: testCodecKey}}, UIOrigins: origins}
	}
}

func codecRequest(t *testing.T, srv *Server, path, auth string, payloads ...*commonpb.Payload) *httptest.ResponseRecorder {
	t.Helper()
	body, err := protojson.Marshal(&commonpb.Payloads{Payloads: payloads})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}

// The codec endpoint opens sealed payloads for an admin only.
func TestCodecEndpointNeedsAnAdmin(t *testing.T) {
	srv, _, _ := newTestServer(t, withCodec())
	ring, err := testKeyring()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := ring.DataConverter().ToPayload("the tenant's secret question")
	if err != nil {
		t.Fatal(err)
	}
	assertJSONError(t, codecRequest(t, srv, "/codec/decode", "", sealed), 401, "unauthorized")
	assertJSONError(t, codecRequest(t, srv, "/codec/decode", "Bearer wrong", sealed), 401, "unauthorized")
	// A chat key is known, and refused.
	assertJSONError(t, codecRequest(t, srv, "/codec/decode", "Bearer k-acme", sealed), 403, "forbidden")

	rec := codecRequest(t, srv, "/codec/decode", "Bearer root", sealed)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "InRoZSB0ZW5hbnQncyBzZWNyZXQgcXVlc3Rpb24i") { // base64 of the JSON string
		t.Fatalf("decode: %d %s", rec.Code, rec.Body)
	}
	var plain commonpb.Payloads
	if err := protojson.Unmarshal(rec.Body.Bytes(), &plain); err != nil || string(plain.Payloads[0].Data) != `"the tenant's secret question"` {
		t.Fatalf("decoded %v %v", &plain, err)
	}
	rec = codecRequest(t, srv, "/codec/encode", "Bearer root", plain.Payloads...)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "ZW5jcnlwdGlvbi1rZXktaWQ") && !strings.Contains(rec.Body.String(), "encryption-key-id") {
		t.Fatalf("encode: %d %s", rec.Code, rec.Body)
	}
	if rec := codecRequest(t, srv, "/codec/decode", "Bearer root", &commonpb.Payload{
		Metadata: map[string][]byte{"encoding": []byte(codec.Encoding), codec.MetadataKeyID: []byte("t1")}, Data: []byte("garbage-garbage-garbage")}); rec.Code != 400 {
		t.Fatalf("garbage: %d %s", rec.Code, rec.Body)
	}
}

// Off, there is no codec endpoint; with the codec on but no admin
// credential configured, it says what to set.
func TestCodecEndpointOffOrWithoutAdmin(t *testing.T) {
	off, _, _ := newTestServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	if rec := codecRequest(t, off, "/codec/decode", "Bearer root"); rec.Code != 404 {
		t.Fatalf("codec off: %d %s", rec.Code, rec.Body)
	}
	noAdmin, _, _ := newTestServer(t, func(c *config.Config) { withCodec()(c); c.Auth.AdminKey = "" })
	assertJSONError(t, codecRequest(t, noAdmin, "/codec/decode", "Bearer root"), 404, "not_found")
}

// The Temporal UI calls the codec from the browser: the configured
// origin passes the preflight (which carries no credentials), another
// does not, and without origins there is no CORS at all.
func TestCodecCORS(t *testing.T) {
	srv, _, _ := newTestServer(t, withCodec("http://localhost:8233"))
	preflight := func(srv *Server, origin string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodOptions, "/codec/decode", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization,content-type,x-namespace")
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec
	}
	rec := preflight(srv, "http://localhost:8233")
	h := rec.Header()
	if rec.Code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "http://localhost:8233" ||
		h.Get("Access-Control-Allow-Credentials") != "true" || !strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), "x-namespace") {
		t.Fatalf("preflight from the UI: %d %v", rec.Code, h)
	}
	if got := preflight(srv, "http://evil.example").Header().Get("Access-Control-Allow-Origin"); got != "" {
		t.Fatalf("another origin allowed: %q", got)
	}
	closed, _, _ := newTestServer(t, withCodec())
	if got := preflight(closed, "http://localhost:8233").Header().Get("Access-Control-Allow-Origin"); got != "" {
		t.Fatalf("no origins configured, yet %q allowed", got)
	}
}

// Wrong credentials on the codec count against the bans like any other
// route's; an admin decoding a long history is not banned for it.
func TestCodecGuessesAreBanned(t *testing.T) {
	srv, _, _ := newBannedServer(t, withCodec(), nil)
	for i := range 20 {
		req := httptest.NewRequest(http.MethodPost, "/codec/decode", strings.NewReader(`{"payloads":[]}`))
		req.RemoteAddr = "198.51.100.30:4000"
		req.Header.Set("Authorization", "Bearer root")
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("admin request %d: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	var last *httptest.ResponseRecorder
	for range 7 {
		last = from(srv, "198.51.100.31", "guess", "POST", "/codec/decode", `{"payloads":[]}`)
	}
	assertJSONError(t, last, 429, "banned")
}

// Client addresses become Redis key names only as their keyed hash: the
// chat's rate-limit buckets and the routes'.
func TestClientAddressesNeverNameRedisKeys(t *testing.T) {
	const key = "test-ip-hash-key-0123456789"
	srv, _, rdb := newTestServer(t, func(c *config.Config) {
		c.Privacy.IPHashKey = key
		c.Auth.AllowAnonymous = true
		tier := c.Limits.Tiers[c.Limits.DefaultTier]
		tier.IP.RequestsPerMinute = 100
		c.Limits.Tiers[c.Limits.DefaultTier] = tier
	})
	const client = "198.51.100.77"
	// The test's Temporal starts nothing; the buckets were charged first.
	if rec := from(srv, client, "", "POST", "/v1/chat", `{"query":"hi"}`); rec.Code == 429 || rec.Code == 400 {
		t.Fatalf("chat: %d %s", rec.Code, rec.Body)
	}
	// This server has no kb store: the route limit was charged first.
	if rec := from(srv, client, "", "GET", "/v1/kb", ""); rec.Code == 429 {
		t.Fatalf("kbs: %d %s", rec.Code, rec.Body)
	}
	keys, err := rdb.Keys(context.Background(), "t:"+t.Name()+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	hash := iphash.New([]byte(key)).Of(client)
	var chat, route bool
	for _, k := range keys {
		if strings.Contains(k, "198.51.100") {
			t.Errorf("key %s names the client's address", k)
		}
		chat = chat || strings.Contains(k, "{ip:"+hash+"}:ip:"+hash+":r")
		route = route || strings.Contains(k, "{ip:reads:"+hash+"}")
	}
	if !chat || !route {
		t.Fatalf("no bucket of the chat (%t) or the reads route (%t) under the hash %s among %v", chat, route, hash, keys)
	}
}
