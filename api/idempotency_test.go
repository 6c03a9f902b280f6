package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
)

// postWithKey sends a chat POST with an Idempotency-Key and reads what the
// server answers within a moment (a started request's stream runs until
// the client leaves).
func postWithKey(t *testing.T, srv *Server, path, body, key, apiKey string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(httpio.IdempotencyHeader, key)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req.WithContext(ctx))
	return rec
}

func withTwoTenants(cfg *config.Config) {
	cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, config.APIKey{Key: "k-globex", Tenant: "globex", Tier: "vip"})
}

func TestIdempotentRetryFollowsTheSameRequest(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		withTwoTenants(c)
		// A bucket that does not refill within the test, to count charges.
		vip := c.Limits.Tiers["vip"]
		vip.Tenant.RequestsPerMinute, vip.Tenant.RequestBurst = 0.01, 10
		c.Limits.Tiers["vip"] = vip
	})
	tc.startedAnyway.Store(true)
	hctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = hubOf(srv).Run(hctx) }()
	key := "order-" + t.Name()
	first := postWithKey(t, srv, "/v1/chat", `{"query":"hello","max_tokens":8}`, key, "k-acme")
	id := first.Header().Get("X-Request-ID")
	if first.Code != http.StatusOK || id == "" || first.Header().Get(httpio.ReplayedHeader) != "" {
		t.Fatalf("first: %d %v %s", first.Code, first.Header(), first.Body)
	}
	// The same request spelled differently is the same request.
	again := postWithKey(t, srv, "/v1/chat", `{ "max_tokens": 8, "query": " hello " }`, key, "k-acme")
	if again.Code != http.StatusOK || again.Header().Get("X-Request-ID") != id || again.Header().Get(httpio.ReplayedHeader) != "true" {
		t.Fatalf("retry: %d %v, want request %s replayed", again.Code, again.Header(), id)
	}
	if !strings.Contains(again.Body.String(), "event: accepted") {
		t.Fatalf("retry's stream %q, want it from the first event", again.Body)
	}
	if n := tc.starts.Load(); n != 1 {
		t.Fatalf("%d workflow starts, want 1", n)
	}
	// The retry was not charged: the next request finds one request
	// gone from acme's bucket since the first, not two.
	next := postWithKey(t, srv, "/v1/chat", `{"query":"next","max_tokens":8}`, key+"-next", "k-acme")
	before, _ := strconv.Atoi(first.Header().Get("X-RateLimit-Remaining-Requests"))
	after, _ := strconv.Atoi(next.Header().Get("X-RateLimit-Remaining-Requests"))
	if before == 0 || after != before-1 {
		t.Fatalf("requests remaining %d after the first, %d after the next: the retry was charged", before, after)
	}
	// Another body with the key is a mistake the client must hear of.
	other := postWithKey(t, srv, "/v1/chat", `{"query":"goodbye","max_tokens":8}`, key, "k-acme")
	if other.Code != http.StatusUnprocessableEntity || !strings.Contains(other.Body.String(), "idempotency_key_reused") {
		t.Fatalf("another body: %d %s, want 422 idempotency_key_reused", other.Code, other.Body)
	}
	// Keys are each tenant's own.
	theirs := postWithKey(t, srv, "/v1/chat", `{"query":"hello","max_tokens":8}`, key, "k-globex")
	if theirs.Code != http.StatusOK || theirs.Header().Get("X-Request-ID") == id || theirs.Header().Get(httpio.ReplayedHeader) != "" {
		t.Fatalf("another tenant's request: %d %v, want a request of its own", theirs.Code, theirs.Header())
	}
	if n := tc.starts.Load(); n != 3 {
		t.Fatalf("%d workflow starts, want 3", n)
	}
}

// A request turned away (rejected: nothing done, nothing charged) frees
// its key, so that the client's retry after Retry-After runs.
func TestRejectedRequestFreesItsKey(t *testing.T) {
	srv, tc, _ := newTestServer(t, nil)
	tc.startedAnyway.Store(true)
	key := "order-" + t.Name()
	first := postWithKey(t, srv, "/v1/chat", `{"query":"hello","max_tokens":8}`, key, "k-acme")
	id := first.Header().Get("X-Request-ID")
	if _, _, err := srv.events.AppendFinal(context.Background(), id, events.TypeRejected, events.Failure{Reason: "queue_timeout"}); err != nil {
		t.Fatal(err)
	}
	again := postWithKey(t, srv, "/v1/chat", `{"query":"hello","max_tokens":8}`, key, "k-acme")
	if again.Code != http.StatusOK || again.Header().Get("X-Request-ID") == id || again.Header().Get(httpio.ReplayedHeader) != "" {
		t.Fatalf("retry after a rejection: %d %v, want a new request", again.Code, again.Header())
	}
	if n := tc.starts.Load(); n != 2 {
		t.Fatalf("%d workflow starts, want 2", n)
	}
}

// Retries that race (a client that timed out and retried at once) start
// one request; every one of them follows it.
func TestRacingRetriesStartOneRequest(t *testing.T) {
	srv, tc, _ := newTestServer(t, nil)
	tc.startedAnyway.Store(true)
	key := "order-" + t.Name()
	const retries = 6
	ids := make([]string, retries)
	var wg sync.WaitGroup
	for i := range retries {
		wg.Go(func() {
			rec := postWithKey(t, srv, "/v1/chat/completions",
				`{"model":"sluice-sim","messages":[{"role":"user","content":"hello"}],"stream":true}`, key, "k-acme")
			ids[i] = rec.Header().Get("X-Request-ID")
		})
	}
	wg.Wait()
	for _, id := range ids[1:] {
		if id == "" || id != ids[0] {
			t.Fatalf("request ids %v, want one", ids)
		}
	}
	if n := tc.starts.Load(); n != 1 {
		t.Fatalf("%d workflow starts, want 1", n)
	}
}

func TestBadIdempotencyKeyIs400(t *testing.T) {
	srv, tc, _ := newTestServer(t, nil)
	rec := postWithKey(t, srv, "/v1/chat", `{"query":"hello"}`, strings.Repeat("k", 300), "k-acme")
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Error.Code != "bad_idempotency_key" {
		t.Fatalf("%d %s, want 400 bad_idempotency_key", rec.Code, rec.Body)
	}
	if tc.starts.Load() != 0 {
		t.Fatal("a request with a bad key was started")
	}
}

// A request whose workflow could not be started gives its key back, and
// ends the stream anyone who attached with the key is reading.
func TestFailedStartGivesTheKeyBack(t *testing.T) {
	srv, tc, _ := newTestServer(t, nil)
	key := "order-" + t.Name()
	first := postWithKey(t, srv, "/v1/chat", `{"query":"hello","max_tokens":8}`, key, "k-acme")
	if first.Code != http.StatusServiceUnavailable {
		t.Fatalf("start failing: %d %s, want 503", first.Code, first.Body)
	}
	tc.startedAnyway.Store(true)
	again := postWithKey(t, srv, "/v1/chat", `{"query":"hello","max_tokens":8}`, key, "k-acme")
	if again.Code != http.StatusOK || again.Header().Get(httpio.ReplayedHeader) != "" {
		t.Fatalf("retry after a failed start: %d %v, want a new request", again.Code, again.Header())
	}
	if n := tc.starts.Load(); n != 2 {
		t.Fatalf("%d workflow starts, want 2", n)
	}
}
