package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.temporal.io/api/serviceerror"

	"github.com/sluice-dev/sluice/api/apispec"
	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/usage"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// redisDownCase is how the walk reaches one route's use of Redis: the
// request sent (path with its parameters filled, credential, body) and,
// for a route whose answer with Redis down is not 503, what it answers.
type redisDownCase struct {
	path, key, body string
	// check, if set, judges the answer instead of wanting 503 unavailable.
	check func(rec *httptest.ResponseRecorder) error
	// bansOff, if set, judges the answer when the bans are off.
	bansOff func(rec *httptest.ResponseRecorder) error
}

// managedKey is a managed key's form (no such key exists): checking it
// needs the key store, so a route reached with it uses Redis even where
// its own work does not.
var managedKey = "sk_abcdefghijkl_" + strings.Repeat("x", 52)

const downRequest = "/v1/requests/chat-01HZY3Q9V7W8X2K4M6N8P0R2T4"

// redisDownCases has a case for every route the server registers, keyed
// as echo names them ("METHOD path"), but those in redisFreeRoutes.
var redisDownCases = map[string]redisDownCase{
	"POST /v1/chat":                      {"/v1/chat", "k-acme", `{"query":"hello"}`, nil, nil},
	"POST /v1/chat/completions":          {"/v1/chat/completions", "k-acme", `{"model":"sluice-sim","messages":[{"role":"user","content":"hi"}]}`, nil, nil},
	"POST /v1/responses":                 {"/v1/responses", "k-acme", `{"model":"sluice-sim","input":"hi","store":false}`, nil, nil},
	"GET /v1/responses/:id":              {"/v1/responses/resp_01HZY3Q9V7W8X2K4M6N8P0R2T4", managedKey, "", nil, nil},
	"DELETE /v1/responses/:id":           {"/v1/responses/resp_01HZY3Q9V7W8X2K4M6N8P0R2T4", managedKey, "", nil, nil},
	"GET /v1/responses/:id/input_items":  {"/v1/responses/resp_01HZY3Q9V7W8X2K4M6N8P0R2T4/input_items", managedKey, "", nil, nil},
	"POST /v1/responses/:id/cancel":      {"/v1/responses/resp_01HZY3Q9V7W8X2K4M6N8P0R2T4/cancel", managedKey, "", nil, nil},
	"POST /v1/files":                     {"/v1/files", managedKey, "", nil, nil},
	"GET /v1/files":                      {"/v1/files", managedKey, "", nil, nil},
	"GET /v1/files/:id":                  {"/v1/files/file-01HZY3Q9V7W8X2K4M6N8P0R2T4", managedKey, "", nil, nil},
	"DELETE /v1/files/:id":               {"/v1/files/file-01HZY3Q9V7W8X2K4M6N8P0R2T4", managedKey, "", nil, nil},
	"GET /v1/files/:id/content":          {"/v1/files/file-01HZY3Q9V7W8X2K4M6N8P0R2T4/content", managedKey, "", nil, nil},
	"GET /v1/models":                     {"/v1/models", managedKey, "", nil, nil},
	"POST /v1/embeddings":                {"/v1/embeddings", "k-acme", `{"model":"` + config.Default().Embedding.Model + `","input":["hello"]}`, nil, nil},
	"GET /v1/requests/:id":               {downRequest, "k-acme", "", nil, nil},
	"GET /v1/requests/:id/events":        {downRequest + "/events", "k-acme", "", nil, nil},
	"DELETE /v1/requests/:id":            {downRequest, "k-acme", "", nil, nil},
	"GET /v1/kb":                         {"/v1/kb", "k-acme", "", nil, nil},
	"GET /v1/kb/:kb":                     {"/v1/kb/facts", "k-acme", "", nil, nil},
	"POST /v1/kb/:kb/documents":          {"/v1/kb/facts/documents", "k-acme", `{"id":"a","text":"# A\n\nsome text"}`, nil, nil},
	"DELETE /v1/kb/:kb/documents/*":      {"/v1/kb/facts/documents/a", "k-acme", "", nil, nil},
	"GET /v1/sessions/:id":               {"/v1/sessions/s-1", "k-acme", "", nil, nil},
	"DELETE /v1/sessions/:id":            {"/v1/sessions/s-1", "k-acme", "", nil, nil},
	"GET /v1/usage":                      {"/v1/usage", managedKey, "", nil, nil},
	"GET /v1/admin/limits":               {"/v1/admin/limits", managedKey, "", nil, nil},
	"PUT /v1/admin/limits":               {"/v1/admin/limits", "root", "", nil, nil}, // body: the live policy
	"GET /v1/admin/queue":                {"/v1/admin/queue", "root", "", nil, nil},
	"POST /v1/admin/keys":                {"/v1/admin/keys", "root", `{"tenant":"acme"}`, nil, nil},
	"GET /v1/admin/keys":                 {"/v1/admin/keys", "root", "", nil, nil},
	"DELETE /v1/admin/keys/:id":          {"/v1/admin/keys/abcdefghijkl", "root", "", nil, nil},
	"GET /v1/admin/bans":                 {"/v1/admin/bans", "root", "", nil, bansAreOff},
	"DELETE /v1/admin/bans/:kind/:value": {"/v1/admin/bans/ip/198.51.100.1", "root", "", nil, bansAreOff},
	"GET /v1/admin/usage":                {"/v1/admin/usage", managedKey, "", nil, nil},
	"POST /codec/decode":                 {"/codec/decode", managedKey, `{"payloads":[]}`, nil, nil},
	"POST /codec/encode":                 {"/codec/encode", managedKey, `{"payloads":[]}`, nil, nil},
	"GET /readyz":                        {"/readyz", "", "", readyShowsRedisDown, nil},
}

// redisFreeRoutes are the routes that never touch Redis, and why.
var redisFreeRoutes = map[string]string{
	"GET /healthz":        "liveness: answers from the process alone",
	"GET /metrics":        "the process's own counters",
	"GET " + apispec.Path: "the API description embedded in the binary",
}

// readyShowsRedisDown: /readyz shows a shared dependency down without
// failing readiness (server.go says why).
func readyShowsRedisDown(rec *httptest.ResponseRecorder) error {
	var r struct {
		Ready        bool              `json:"ready"`
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != http.StatusOK || !r.Ready || r.Dependencies["redis"] != "unavailable" {
		return fmt.Errorf("%d %s; want 200, ready, redis unavailable", rec.Code, rec.Body)
	}
	return nil
}

// bansAreOff: with the bans off, the routes that list and lift them say so.
func bansAreOff(rec *httptest.ResponseRecorder) error {
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "limits.ban.enabled") {
		return fmt.Errorf("%d %s; want 404, bans off", rec.Code, rec.Body)
	}
	return nil
}

// With the Redis every component shares stopped, every route that needs it
// answers 503 unavailable with Retry-After and retry_after_s, and no answer
// carries what the error said (an address, a Redis error's text): a
// dependency outage is the client's to wait out, never its mistake and
// never a 500. The walk is the server's own route list: a route with no
// case (and not named free of Redis) fails the test. It runs with the
// bans on (every caller's first Redis round trip) and off, so that each
// route's own use of Redis is reached too.
func TestRedisDownIsUnavailableOnEveryRoute(t *testing.T) {
	for _, bans := range []bool{true, false} {
		t.Run(fmt.Sprintf("bans=%v", bans), func(t *testing.T) { redisDownWalk(t, bans) })
	}
}

func redisDownWalk(t *testing.T, bans bool) {
	r := testenv.StartRedis(t)
	srv, _, _ := newTestServerOn(t, r.Addr, func(c *config.Config) {
		withCodec()(c)
		c.Limits.Ban.Enabled = bans
	}, func(rdb *redis.Client, o *Options) {
		withKBs(t)(rdb, o)
		withSessions(t)(rdb, o)
		o.Usage = redisDownLedger(t)
		o.Embeddings = embed.NewCache(embed.NewLocal(embed.LocalOptions{}), rdb, embed.CacheOptions{Prefix: testenv.KeyPrefix(t), TTL: time.Minute, LRUSize: 16})
		if !bans {
			return
		}
		var err error
		if o.Bans, err = ban.New(rdb, ban.Options{KeyPrefix: testenv.KeyPrefix(t), Threshold: 5, Window: 10 * time.Second, Duration: time.Second}); err != nil {
			t.Fatal(err)
		}
	})
	srv.temporal = healthyTemporal{srv.temporal}
	srv.keyCache = keys.NewCache(keys.NewStore(srv.redis, "t:"+t.Name()+":"), keys.CacheOptions{TTL: time.Hour, Logger: srv.logger})
	policyBody := admin(srv, "GET", "/v1/admin/limits", "root", "")
	if policyBody.Code != http.StatusOK {
		t.Fatalf("the live policy: %d %s", policyBody.Code, policyBody.Body)
	}
	r.Stop()

	walked := 0
	for _, route := range srv.echo.Routes() {
		name := route.Method + " " + route.Path
		if route.Method == echo.RouteNotFound {
			continue // echo's own fallback of a group, not a route
		}
		if _, free := redisFreeRoutes[name]; free {
			continue
		}
		rt, ok := redisDownCases[name]
		if !ok {
			t.Errorf("%s: no case in redisDownCases (nor in redisFreeRoutes): the walk would miss it", name)
			continue
		}
		walked++
		body := rt.body
		if name == "PUT /v1/admin/limits" {
			body = policyBody.Body.String()
		}
		rec := admin(srv, route.Method, rt.path, rt.key, body)
		check, leaks := unavailable, []string{r.Addr, "127.0.0.1", "dial tcp", "connection refused", "goroutine", "redis"}
		switch {
		case rt.check != nil:
			// Its answer names the dependency, by design.
			check, leaks = rt.check, leaks[:len(leaks)-1]
		case !bans && rt.bansOff != nil:
			check = rt.bansOff
		}
		if err := check(rec); err != nil {
			t.Errorf("%s (%s) with Redis down: %v", name, rt.path, err)
		}
		for _, leak := range leaks {
			if strings.Contains(strings.ToLower(rec.Body.String()), leak) {
				t.Errorf("%s: the answer carries %q: %s", name, leak, rec.Body)
			}
		}
	}
	if walked != len(redisDownCases) {
		t.Errorf("walked %d routes, redisDownCases has %d: a case names a route the server does not register", walked, len(redisDownCases))
	}
	t.Logf("walked %d of the server's routes with Redis down", walked)
}

// unavailable checks a 503 unavailable with Retry-After (and retry_after_s
// in Sluice's own error shape; OpenAI's has no such field).
func unavailable(rec *httptest.ResponseRecorder) error {
	var e struct {
		Error struct {
			Code       string `json:"code"`
			Type       string `json:"type"`
			RetryAfter int    `json:"retry_after_s"`
		} `json:"error"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &e)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || e.Error.Code != "unavailable" ||
		e.Error.RetryAfter <= 0 && e.Error.Type == "" {
		return fmt.Errorf("%d (Retry-After %q) %s; want 503 unavailable with Retry-After", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	return nil
}

// redisDownLedger is a usage ledger of its own (SQLite), up while Redis
// is down.
func redisDownLedger(t *testing.T) usage.Store {
	ledger, err := usage.OpenSQLite(context.Background(), usage.SQLiteOptions{Path: filepath.Join(t.TempDir(), "usage.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ledger.Close() })
	return ledger
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
