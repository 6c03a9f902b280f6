package api

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/apispec"
	"github.com/sluice-dev/sluice/api/apispec/spectest"
	"github.com/sluice-dev/sluice/pkg/config"
)

// echoParam is a path parameter as Echo writes it (":id").
var echoParam = regexp.MustCompile(`:([A-Za-z_][A-Za-z0-9_]*)`)

// servedRoutes are the routes the server's router serves, as "METHOD
// /path" with OpenAPI's path templates ({id}), on a server with every
// optional route on (the codec with its CORS preflight, /metrics on the
// API's port).
func servedRoutes(t *testing.T) []string {
	t.Helper()
	srv, _, _ := newTestServer(t, func(c *config.Config) {
		withCodec("https://temporal-ui.example")(c)
		c.Metrics.Addr = ""
	})
	var out []string
	for _, r := range srv.echo.Routes() {
		// A group with middleware registers catch-alls that answer 404
		// within it; they are not routes.
		if r.Method == echo.RouteNotFound {
			continue
		}
		out = append(out, r.Method+" "+echoParam.ReplaceAllString(r.Path, "{$1}"))
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// Every route the router serves is described in the OpenAPI description,
// with its method, and nothing is described that is not served.
func TestEveryRouteIsDescribed(t *testing.T) {
	spec, err := spectest.Load()
	if err != nil {
		t.Fatal(err)
	}
	served, described := servedRoutes(t), spec.Operations()
	for _, r := range served {
		if !slices.Contains(described, r) {
			t.Errorf("%s is served but not described in api/apispec/openapi.yaml", r)
		}
	}
	for _, op := range described {
		if !slices.Contains(served, op) {
			t.Errorf("%s is described in api/apispec/openapi.yaml but not served", op)
		}
	}
	if len(served) < 20 {
		t.Fatalf("only %d routes served: %v", len(served), served)
	}
}

// The server serves its description without a key, like /healthz.
func TestOpenAPIServedWithoutAKey(t *testing.T) {
	srv, _, _ := newTestServer(t, func(c *config.Config) { c.Auth.AllowAnonymous = false })
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, apispec.Path, nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %q %.200s", apispec.Path, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
}
