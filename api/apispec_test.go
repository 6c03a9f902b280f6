package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/apispec"
	"github.com/sluice-dev/sluice/api/apispec/spectest"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
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
	return routesOf(srv.echo)
}

// routesOf are the routes e serves, as "METHOD /path" with OpenAPI's
// path templates ({id}).
func routesOf(e *echo.Echo) []string {
	var out []string
	for _, r := range e.Routes() {
		// A group with middleware registers catch-alls that answer 404
		// within it; they are not routes.
		if r.Method == echo.RouteNotFound {
			continue
		}
		path := echoParam.ReplaceAllString(r.Path, "{$1}")
		// A trailing wildcard is a parameter that may hold "/" (a
		// document's id); OpenAPI names it as one parameter.
		if rest, ok := strings.CutSuffix(path, "/*"); ok {
			path = rest + "/{id}"
		}
		out = append(out, r.Method+" "+path)
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

// The event streams' description names every event type of pkg/events,
// and no other.
func TestEveryEventTypeIsDescribed(t *testing.T) {
	spec, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	types := []string{events.TypeAccepted, events.TypeQueue, events.TypeStage, events.TypeToken,
		events.TypeDone, events.TypeRejected, events.TypeError}
	for _, op := range [][2]string{{"POST", "/v1/chat"}, {"GET", "/v1/requests/{id}/events"}} {
		described := spec.StreamEvents(op[0], op[1])
		for _, typ := range types {
			if _, ok := described[typ]; !ok {
				t.Errorf("%s %s: event %q is not in x-sse-events", op[0], op[1], typ)
			}
		}
		for name := range described {
			if !slices.Contains(types, name) {
				t.Errorf("%s %s: x-sse-events names %q, which pkg/events does not send", op[0], op[1], name)
			}
		}
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

// loadSpec is the description, loaded once for the package's tests.
var loadSpec = sync.OnceValues(spectest.Load)

// specChecked wraps a test server's handler so that every answer to a
// described operation is checked against the OpenAPI description, in
// every test of the package: they reach error paths the integration
// tests cannot (stalled Redis, full queues, bans, bad bodies). Routes the
// description does not name (404s, 405s) and 500s (bugs, which the
// description leaves out) are not checked, nor are the routes this
// server does not serve (a described route that is off in its
// configuration answers 404 like any unknown path).
func specChecked(t *testing.T, e *echo.Echo, next http.Handler) http.Handler {
	spec, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	served := routesOf(e)
	var mu sync.Mutex
	ended := false
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		ended = true
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &teeWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		if op, err := spec.Operation(r); err != nil || !slices.Contains(served, op) || rec.status == http.StatusInternalServerError ||
			connectionCapAnswer(rec.status, rec.body.Bytes()) {
			return
		}
		resp := &http.Response{StatusCode: rec.status, Header: w.Header().Clone(), Body: io.NopCloser(bytes.NewReader(rec.body.Bytes())), Request: r}
		if _, _, err := spec.CheckResponse(r, resp); err != nil {
			mu.Lock()
			defer mu.Unlock()
			// A stream may end after its test did, when t may not be
			// used.
			if !ended {
				t.Errorf("the answer does not match api/apispec/openapi.yaml: %v", err)
			}
		}
	})
}

// connectionCapAnswer says whether an answer is one of the connection
// caps' refusals, which the description gives once for every route (its
// info.description), not per route: a client behind a trusted proxy gets
// its api.max_conns_per_ip refusal from a handler of any route.
func connectionCapAnswer(status int, body []byte) bool {
	var e struct {
		Error struct{ Code string }
	}
	return status == http.StatusTooManyRequests && json.Unmarshal(body, &e) == nil && e.Error.Code == request.ReasonTooManyConnections
}

// uncheckedHandlers are the test servers' handlers before specChecked.
var uncheckedHandlers sync.Map // *Server -> http.Handler

// unchecked stops checking srv's answers against the description, for a
// test that measures what the handler alone costs.
func unchecked(srv *Server) {
	h, _ := uncheckedHandlers.Load(srv)
	srv.handler = h.(http.Handler)
}

// teeWriter passes a response through and keeps its status and body.
type teeWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
	body   bytes.Buffer
}

func (w *teeWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *teeWriter) Write(b []byte) (int, error) {
	w.wrote = true
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// write deadlines).
func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *teeWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
