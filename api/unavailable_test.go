package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.temporal.io/api/serviceerror"

	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// With the Redis every component shares stopped, every route that needs it
// answers 503 unavailable with Retry-After and retry_after_s, and no answer
// carries what the error said (an address, a Redis error's text): a
// dependency outage is the client's to wait out, never its mistake and
// never a 500.
func TestRedisDownIsUnavailableOnEveryRoute(t *testing.T) {
	r := testenv.StartRedis(t)
	srv, _, _ := newTestServerOn(t, r.Addr, func(c *config.Config) { c.Auth.AdminKey = "root" }, func(rdb *redis.Client, o *Options) {
		withKBs(t)(rdb, o)
		withSessions(t)(rdb, o)
		var err error
		if o.Bans, err = ban.New(rdb, ban.Options{KeyPrefix: testenv.KeyPrefix(t), Threshold: 5, Window: 10 * time.Second, Duration: time.Second}); err != nil {
			t.Fatal(err)
		}
	})
	srv.keyCache = keys.NewCache(keys.NewStore(srv.redis, "t:"+t.Name()+":"), keys.CacheOptions{TTL: time.Hour, Logger: srv.logger})
	r.Stop()

	routes := []struct{ method, path, key, body string }{
		{"POST", "/v1/chat", "k-acme", `{"query":"hello"}`},
		{"POST", "/v1/chat/completions", "k-acme", `{"model":"sluice-sim","messages":[{"role":"user","content":"hi"}]}`},
		{"GET", "/v1/requests/chat-01HZY3Q9V7W8X2K4M6N8P0R2T4", "k-acme", ""},
		{"GET", "/v1/requests/chat-01HZY3Q9V7W8X2K4M6N8P0R2T4/events", "k-acme", ""},
		{"DELETE", "/v1/requests/chat-01HZY3Q9V7W8X2K4M6N8P0R2T4", "k-acme", ""},
		{"GET", "/v1/kb", "k-acme", ""},
		{"GET", "/v1/kb/facts", "k-acme", ""},
		{"POST", "/v1/kb/facts/documents", "k-acme", `{"id":"a","text":"# A\n\nsome text"}`},
		{"DELETE", "/v1/kb/facts/documents/a", "k-acme", ""},
		{"GET", "/v1/sessions/s-1", "k-acme", ""},
		{"DELETE", "/v1/sessions/s-1", "k-acme", ""},
		{"GET", "/v1/admin/queue", "root", ""},
		{"GET", "/v1/admin/keys", "root", ""},
		{"POST", "/v1/admin/keys", "root", `{"tenant":"acme"}`},
		{"GET", "/v1/admin/bans", "root", ""},
		// A managed key's form: checking it needs the key store.
		{"GET", "/v1/models", "sk_abcdefghijkl_" + strings.Repeat("x", 52), ""},
	}
	for _, rt := range routes {
		rec := admin(srv, rt.method, rt.path, rt.key, rt.body)
		body := rec.Body.String()
		var e struct {
			Error struct {
				Code       string `json:"code"`
				Type       string `json:"type"`
				RetryAfter int    `json:"retry_after_s"`
			} `json:"error"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		unavailable := e.Error.Code == "unavailable" && (e.Error.RetryAfter > 0 || strings.HasPrefix(rt.path, "/v1/chat/completions") || rt.path == "/v1/models")
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || !unavailable {
			t.Errorf("%s %s with Redis down: %d (Retry-After %q) %s; want 503 unavailable with Retry-After",
				rt.method, rt.path, rec.Code, rec.Header().Get("Retry-After"), body)
		}
		for _, leak := range []string{r.Addr, "127.0.0.1", "dial tcp", "connection refused", "redis", "goroutine"} {
			if strings.Contains(strings.ToLower(body), leak) {
				t.Errorf("%s %s: the answer carries %q: %s", rt.method, rt.path, leak, body)
			}
		}
	}
}

// An error no handler classified is a 503 when it says a dependency
// failed (Redis unreachable, Temporal unavailable or too slow), a 500
// otherwise; neither carries the error's text.
func TestUnclassifiedErrorsSayUnavailableOnlyForDependencies(t *testing.T) {
	srv, _, _ := newTestServer(t, nil)
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused 10.0.0.7:6379")}
	for path, err := range map[string]error{
		"/test/redis":    fmt.Errorf("read kb: %w", refused),
		"/test/temporal": fmt.Errorf("describe workflow: %w", serviceerror.NewUnavailable("frontend 10.0.0.8:7233 unreachable")),
		"/test/deadline": fmt.Errorf("read events: %w", context.DeadlineExceeded),
		"/test/bug":      errors.New("index out of range at 10.0.0.9"),
	} {
		srv.echo.GET(path, func(echo.Context) error { return err })
	}
	for path, want := range map[string]int{"/test/redis": 503, "/test/temporal": 503, "/test/deadline": 503, "/test/bug": 500} {
		rec := call(srv, "GET", path, "")
		if rec.Code != want || strings.Contains(rec.Body.String(), "10.0.0.") {
			t.Errorf("GET %s: %d %s; want %d without the error's text", path, rec.Code, rec.Body, want)
		}
		if rec.Code == 503 && rec.Header().Get("Retry-After") == "" {
			t.Errorf("GET %s: 503 without Retry-After", path)
		}
	}
}
