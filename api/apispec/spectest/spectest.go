// Package spectest checks Sluice's HTTP API against its OpenAPI
// description (package apispec) with libopenapi-validator: which routes it
// describes, and whether a real response (status, headers, JSON body, and
// each event of an event stream) is one the description allows. It is for
// tests; no production code imports it.
package spectest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	vconfig "github.com/pb33f/libopenapi-validator/config"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	"github.com/sluice-dev/sluice/api/apispec"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// Spec is the API description, loaded for checking.
type Spec struct {
	doc     libopenapi.Document
	model   *v3.Document
	check   validator.Validator
	schemas schema_validation.SchemaValidator
	// raw is the served JSON, for the extensions (x-sse-events,
	// x-sse-data), which the model keeps as YAML nodes.
	raw map[string]any
}

// Load reads the description as GET /openapi.json serves it.
func Load() (*Spec, error) {
	doc, err := apispec.JSON("test")
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	if err := json.Unmarshal(doc, &raw); err != nil {
		return nil, fmt.Errorf("read the served description: %w", err)
	}
	d, err := libopenapi.NewDocument(doc)
	if err != nil {
		return nil, fmt.Errorf("parse the API description: %w", err)
	}
	m, err := d.BuildV3Model()
	if err != nil {
		return nil, fmt.Errorf("build the API description's model: %w", err)
	}
	v, errs := validator.NewValidator(d, vconfig.WithFormatAssertions())
	if len(errs) > 0 {
		return nil, fmt.Errorf("build the validator: %w", errors.Join(errs...))
	}
	return &Spec{doc: d, model: &m.Model, check: v, schemas: schema_validation.NewSchemaValidator(vconfig.WithFormatAssertions()), raw: raw}, nil
}

// ValidateDocument checks the description against the OpenAPI 3.1
// specification's own schema.
func (s *Spec) ValidateDocument() error {
	if ok, errs := s.check.ValidateDocument(); !ok {
		return joinErrors("the description is not valid OpenAPI", errs)
	}
	return nil
}

// Operations are the described operations as "METHOD /path" (OpenAPI's
// path templates, {param}).
func (s *Spec) Operations() []string {
	var out []string
	for path, item := range s.model.Paths.PathItems.FromOldest() {
		for method := range item.GetOperations().KeysFromOldest() {
			out = append(out, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(out)
	return out
}

// SchemaNames are the component schemas an operation's event streams
// name: x-sse-events' values and x-sse-data, for the test that checks
// that each names a schema that exists.
func (s *Spec) SchemaNames() []string {
	var out []string
	for path, item := range s.model.Paths.PathItems.FromOldest() {
		for method := range item.GetOperations().KeysFromOldest() {
			events, data := s.streamSchemas(path, method, "200")
			for _, name := range events {
				out = append(out, name)
			}
			if data != "" {
				out = append(out, data)
			}
		}
	}
	return out
}

// StreamEvents is the x-sse-events of an operation's 200 answer: each
// event name and the component schema of its data ("POST", "/v1/chat").
func (s *Spec) StreamEvents(method, path string) map[string]string {
	events, _ := s.streamSchemas(path, strings.ToLower(method), "200")
	return events
}

// HasSchema reports whether the components name this schema.
func (s *Spec) HasSchema(name string) bool {
	return s.model.Components.Schemas.GetOrZero(name) != nil
}

// CheckRequest checks req (its parameters, body and credentials) against
// the description: a request the server accepted should be one the
// description allows. req's body is read and put back.
func (s *Spec) CheckRequest(req *http.Request) error {
	if req.Body != nil {
		body, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return fmt.Errorf("%s %s: read the request: %w", req.Method, req.URL.Path, err)
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		defer func() { req.Body = io.NopCloser(bytes.NewReader(body)) }()
	}
	if ok, errs := s.check.ValidateHttpRequestSync(req); !ok {
		return joinErrors(fmt.Sprintf("request %s %s", req.Method, req.URL.RequestURI()), errs)
	}
	return nil
}

// CheckResponse checks resp, the answer to req, against the description:
// its status is one the operation lists, its declared headers are as
// described and its JSON body matches the schema. An event stream
// (text/event-stream) is read to its end, each event's data checked
// against the schema its event name maps to in x-sse-events (or, for
// OpenAI's nameless chunks, x-sse-data); it returns the stream's events.
// resp's body is consumed; the returned events and body stand for it.
func (s *Spec) CheckResponse(req *http.Request, resp *http.Response) ([]testenv.SSEEvent, []byte, error) {
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return nil, body, fmt.Errorf("%s %s: read the response: %w", req.Method, req.URL.Path, err)
	}
	if ok, errs := s.check.ValidateHttpResponse(req, resp); !ok {
		return nil, body, joinErrors(fmt.Sprintf("%s %s → %d %s", req.Method, req.URL.Path, resp.StatusCode, clip(body)), errs)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "text/event-stream" {
		return nil, body, nil
	}
	path, method, err := s.operationOf(req)
	if err != nil {
		return nil, body, err
	}
	events, data := s.streamSchemas(path, method, strconv.Itoa(resp.StatusCode))
	if len(events) == 0 && data == "" {
		return nil, body, fmt.Errorf("%s %s: an event stream that the description gives no x-sse-events or x-sse-data", req.Method, path)
	}
	var got []testenv.SSEEvent
	r := testenv.NewSSEReader(bytes.NewReader(body))
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			return got, body, nil
		}
		if err != nil {
			return got, body, fmt.Errorf("%s %s: parse the event stream: %w", req.Method, path, err)
		}
		got = append(got, ev)
		if err := s.checkEvent(events, data, ev); err != nil {
			return got, body, fmt.Errorf("%s %s: %w", req.Method, path, err)
		}
	}
}

// checkEvent checks one event's data against its schema.
func (s *Spec) checkEvent(events map[string]string, data string, ev testenv.SSEEvent) error {
	name := data
	if ev.Event != "" || len(events) > 0 {
		var ok bool
		if name, ok = events[ev.Event]; !ok {
			return fmt.Errorf("event %q (id %s) is not one x-sse-events names", ev.Event, ev.ID)
		}
	} else if ev.Data == "[DONE]" {
		return nil
	}
	return s.CheckSchema(name, []byte(ev.Data))
}

// CheckSchema checks a JSON value against the named component schema.
func (s *Spec) CheckSchema(name string, value []byte) error {
	proxy := s.model.Components.Schemas.GetOrZero(name)
	if proxy == nil {
		return fmt.Errorf("no component schema %q", name)
	}
	sch := proxy.Schema()
	if ok, errs := s.schemas.ValidateSchemaBytesWithVersion(sch, value, 3.1); !ok {
		return joinErrors(fmt.Sprintf("%s %s", name, clip(value)), errs)
	}
	return nil
}

// Operation names the described operation req calls, as Operations
// does ("GET /v1/requests/{id}").
func (s *Spec) Operation(req *http.Request) (string, error) {
	path, method, err := s.operationOf(req)
	if err != nil {
		return "", err
	}
	if s.model.Paths.PathItems.GetOrZero(path).GetOperations().GetOrZero(method) == nil {
		return "", fmt.Errorf("%s %s: not described", req.Method, path)
	}
	return strings.ToUpper(method) + " " + path, nil
}

// operationOf finds the described path template and method of req.
func (s *Spec) operationOf(req *http.Request) (path, method string, err error) {
	for p := range s.model.Paths.PathItems.KeysFromOldest() {
		if templateMatches(p, req.URL.Path) {
			return p, strings.ToLower(req.Method), nil
		}
	}
	return "", "", fmt.Errorf("%s %s: no described path", req.Method, req.URL.Path)
}

// templateMatches reports whether path fits an OpenAPI path template,
// each {param} one segment.
func templateMatches(template, path string) bool {
	ts, ps := strings.Split(template, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return false
	}
	for i, seg := range ts {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			if ps[i] == "" {
				return false
			}
			continue
		}
		if seg != ps[i] {
			return false
		}
	}
	return true
}

// streamSchemas reads the text/event-stream content of an operation's
// response: x-sse-events (event name → component schema name) and
// x-sse-data (the schema of nameless events' data).
func (s *Spec) streamSchemas(path, method, code string) (events map[string]string, data string) {
	resp, ok := dig(s.raw, "paths", path, method, "responses", code)
	if !ok {
		return nil, ""
	}
	resp = s.deref(resp)
	media, ok := dig(resp, "content", "text/event-stream")
	if !ok {
		return nil, ""
	}
	if m, ok := dig(media, "x-sse-events"); ok {
		events = map[string]string{}
		for name, ref := range m.(map[string]any) {
			events[name] = schemaName(ref)
		}
	}
	if ref, ok := dig(media, "x-sse-data"); ok {
		data = schemaName(ref)
	}
	return events, data
}

// deref follows a {"$ref": "#/..."} within the document.
func (s *Spec) deref(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	ref, ok := m["$ref"].(string)
	if !ok {
		return v
	}
	keys := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
	out, ok := dig(s.raw, keys...)
	if !ok {
		return v
	}
	return out
}

// schemaName is the component name of {"$ref": "#/components/schemas/X"}.
func schemaName(ref any) string {
	m, _ := ref.(map[string]any)
	r, _ := m["$ref"].(string)
	return strings.TrimPrefix(r, "#/components/schemas/")
}

// dig walks nested objects by keys.
func dig(v any, keys ...string) (any, bool) {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

func joinErrors(what string, errs []*verrors.ValidationError) error {
	var b strings.Builder
	b.WriteString(what)
	for _, e := range errs {
		fmt.Fprintf(&b, "\n  - %s: %s", e.Message, e.Reason)
		for _, se := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n      %s at %s (%s)", se.Reason, se.FieldPath, se.KeywordLocation)
		}
	}
	return errors.New(b.String())
}

// clip is a body short enough for an error message.
func clip(b []byte) string {
	const most = 600
	if len(b) > most {
		return string(b[:most]) + "…"
	}
	return string(b)
}
