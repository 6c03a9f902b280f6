// Package apispec is the OpenAPI 3.1 description of Sluice's HTTP API
// (openapi.yaml, beside this file) and its route, GET /openapi.json. The
// document is written by hand next to the handlers; the api package's
// tests check it against the router (every route served is described,
// nothing described is not served) and the integration tests check real
// responses against it.
package apispec

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"sigs.k8s.io/yaml"
)

// Path is where the description is served.
const Path = "/openapi.json"

// YAML is the description as written.
//
//go:embed openapi.yaml
var YAML []byte

// JSON is the description as served: YAML converted to JSON, with
// info.version set to version (the build's), so that a client can tell
// which build a document describes.
func JSON(version string) ([]byte, error) {
	raw, err := yaml.YAMLToJSON(YAML)
	if err != nil {
		return nil, fmt.Errorf("convert openapi.yaml to JSON: %w", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("read openapi.yaml: %w", err)
	}
	info, ok := doc["info"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("openapi.yaml has no info object")
	}
	info["version"] = version
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode the API description: %w", err)
	}
	return out, nil
}

// Handler serves the description built by JSON, converted once here. It
// changes only with the build, so clients and proxies may keep it an hour
// and revalidate by its ETag.
func Handler(version string) (http.Handler, error) {
	doc, err := JSON(version)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(doc)
	etag := `"` + hex.EncodeToString(sum[:16]) + `"`
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "public, max-age=3600")
		h.Set("ETag", etag)
		// ServeContent answers If-None-Match with 304 and HEAD without a
		// body; a zero time sends no Last-Modified.
		http.ServeContent(w, r, "openapi.json", time.Time{}, bytes.NewReader(doc))
	}), nil
}
