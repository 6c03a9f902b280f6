package api

import (
	"net/http"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
)

// Reads, resumes and ingestion each have their tier's own limit, per
// tenant: a tenant that spends its reads is refused reads with 429 and
// Retry-After, and can still ingest.
func TestRouteLimits(t *testing.T) {
	srv, _, _ := newTestServer(t, func(c *config.Config) {
		vip := c.Limits.Tiers["vip"]
		vip.Routes = policy.RouteLimits{Reads: policy.RouteRate{TenantPerMinute: 2}, Ingest: policy.RouteRate{TenantPerMinute: 1}}
		c.Limits.Tiers["vip"] = vip
	})
	const someone = "/v1/requests/chat-01M8RXVGWWZVKQP5ZVA6RPTEZA"
	for i := range 2 {
		if rec := call(srv, http.MethodGet, someone, ""); rec.Code != http.StatusNotFound {
			t.Fatalf("read %d: %d %s, want 404 (past the limit, no such request)", i, rec.Code, rec.Body)
		}
	}
	rec := call(srv, http.MethodDelete, someone, "")
	assertJSONError(t, rec, http.StatusTooManyRequests, "rate_limited")
	if rec.Header().Get("Retry-After") == "" {
		t.Fatalf("429 without Retry-After: %v", rec.Header())
	}
	// Ingestion is counted apart: its first request passes the limit (and
	// is then refused for what it is), its second is limited.
	body := `{"documents":[]}`
	if rec := call(srv, http.MethodPost, "/v1/kb/notes/documents", body); rec.Code == http.StatusTooManyRequests {
		t.Fatalf("ingestion limited by reads: %s", rec.Body)
	}
	assertJSONError(t, call(srv, http.MethodPost, "/v1/kb/notes/documents", body), http.StatusTooManyRequests, "rate_limited")
}
