package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/metrics"
)

// The public port's /metrics (metrics.addr unset), which anyone may read,
// leaves out the series that name tenants.
func TestPublicMetricsNameNoTenant(t *testing.T) {
	srv, _, _ := newTestServerWith(t, nil, func(_ *redis.Client, o *Options) {
		o.Metrics.TrackTenants(5)
		o.Metrics.TenantServed(metrics.TenantService{Tenant: "acme", Pool: "short", Tier: "vip", PromptTokens: 10})
		o.Metrics.Refused(metrics.OutcomeRejectedRate)
	})
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.Contains(body, `sluice_requests_total{outcome="rejected_rate",route=""} 1`) {
		t.Fatalf("GET /metrics: %d, without the requests counter", rec.Code)
	}
	if strings.Contains(body, "sluice_tenant_") || strings.Contains(body, "acme") {
		t.Fatal("the public /metrics names a tenant")
	}
}
