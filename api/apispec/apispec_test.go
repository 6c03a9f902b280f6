package apispec_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluice-dev/sluice/api/apispec"
	"github.com/sluice-dev/sluice/api/apispec/spectest"
)

// The description is valid OpenAPI 3.1, and every schema its event
// streams name exists.
func TestDescriptionIsValidOpenAPI(t *testing.T) {
	spec, err := spectest.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.ValidateDocument(); err != nil {
		t.Fatal(err)
	}
	names := spec.SchemaNames()
	if len(names) == 0 {
		t.Fatal("no operation names the schemas of its event stream (x-sse-events)")
	}
	for _, name := range names {
		if !spec.HasSchema(name) {
			t.Errorf("an event stream names schema %q, which components.schemas lacks", name)
		}
	}
}

// GET /openapi.json is the description as JSON with the build's version,
// cacheable: a client holding its ETag gets 304.
func TestHandlerServesJSONWithTheVersion(t *testing.T) {
	h, err := apispec.Handler("v9.9.9-test")
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, apispec.Path, nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %q", apispec.Path, rec.Code, rec.Header().Get("Content-Type"))
	}
	var doc struct {
		OpenAPI string `json:"openapi"`
		Info    struct {
			Version string `json:"version"`
		} `json:"info"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" || doc.Info.Version != "v9.9.9-test" {
		t.Fatalf("openapi %q, info.version %q", doc.OpenAPI, doc.Info.Version)
	}
	etag := rec.Header().Get("ETag")
	if etag == "" || rec.Header().Get("Cache-Control") == "" {
		t.Fatalf("no ETag or Cache-Control: %v", rec.Header())
	}
	req := httptest.NewRequest(http.MethodGet, apispec.Path, nil)
	req.Header.Set("If-None-Match", etag)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotModified || rec.Body.Len() != 0 {
		t.Fatalf("If-None-Match with the ETag: %d, %d bytes", rec.Code, rec.Body.Len())
	}
}
