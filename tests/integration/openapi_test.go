package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/api/apispec/spectest"
	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// specAdminKey is the admin key of the stack startSpecStack runs.
const specAdminKey = "it-spec-admin"

// specUIOrigin is the Temporal UI origin that stack allows to call the
// codec from a browser.
const specUIOrigin = "https://temporal-ui.example"

// startSpecStack runs an API process (with its embedded worker) that
// serves every route: the admin key, the codec and its CORS preflight,
// the bans and /metrics on its own port, which the package's stack has
// off or elsewhere. Its task queue and key prefix keep it apart.
func startSpecStack(t *testing.T) string {
	t.Helper()
	cfg := stack.cfg
	cfg.Temporal.TaskQueue = "sluice-openapi"
	cfg.Redis.KeyPrefix = "itoas:"
	cfg.Metrics.Addr = ""
	cfg.Auth.AdminKey = specAdminKey
	cfg.Codec = codecTestConfig()
	cfg.Codec.UIOrigins = []string{specUIOrigin}
	cfg.Limits.Ban.Enabled = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, err := app.StartAPI(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := api.Stop(20 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return api.URL
}

// specClient calls a stack and checks every answer against the API's
// OpenAPI description, keeping which described operations it called.
type specClient struct {
	t      *testing.T
	spec   *spectest.Spec
	base   string
	called map[string]bool
}

// specCall is one request of a specClient.
type specCall struct {
	method, path, body string
	// key is sent as Authorization: Bearer; "" sends none.
	key    string
	header map[string]string
	// contentType defaults to application/json when there is a body.
	contentType string
}

// specAnswer is a checked answer.
type specAnswer struct {
	resp   *http.Response
	body   []byte
	events []testenv.SSEEvent
}

// send makes the call and returns its response unread, for a caller that
// acts while the answer streams; finish checks it.
func (c *specClient) send(ctx context.Context, call specCall) (*http.Request, *http.Response) {
	c.t.Helper()
	var body io.Reader
	if call.body != "" {
		body = strings.NewReader(call.body)
	}
	req, err := http.NewRequestWithContext(ctx, call.method, c.base+call.path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if call.body != "" {
		req.Header.Set("Content-Type", cmpOr(call.contentType, "application/json"))
	}
	if call.key != "" {
		req.Header.Set("Authorization", "Bearer "+call.key)
	}
	for k, v := range call.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", call.method, call.path, err)
	}
	return req, resp
}

// finish reads the answer to req, checks it against the description and
// that its status is want, and notes the operation as called. A request
// the server accepted (2xx) is checked against the description too.
func (c *specClient) finish(req *http.Request, resp *http.Response, want int) specAnswer {
	c.t.Helper()
	if want/100 == 2 {
		// The client consumed the body it sent; GetBody reads it again.
		sent := req.Clone(req.Context())
		sent.Body = http.NoBody
		if req.GetBody != nil {
			sent.Body, _ = req.GetBody()
		}
		if err := c.spec.CheckRequest(sent); err != nil {
			c.t.Error(err)
		}
	}
	evs, body, err := c.spec.CheckResponse(req, resp)
	if err != nil {
		c.t.Error(err)
	}
	if resp.StatusCode != want {
		c.t.Fatalf("%s %s: %d %s, want %d", req.Method, req.URL.Path, resp.StatusCode, clipBody(body), want)
	}
	op, err := c.spec.Operation(req)
	if err != nil {
		c.t.Fatal(err)
	}
	c.called[op] = true
	return specAnswer{resp: resp, body: body, events: evs}
}

// do is send and finish.
func (c *specClient) do(call specCall, want int) specAnswer {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, resp := c.send(ctx, call)
	return c.finish(req, resp, want)
}

// decode unmarshals a checked answer's JSON body.
func (a specAnswer) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("%v in %s", err, clipBody(a.body))
	}
}

func clipBody(b []byte) string {
	if len(b) > 400 {
		return string(b[:400]) + "…"
	}
	return string(b)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Real answers of every route described in the API's OpenAPI description
// (api/apispec) match it: statuses, headers and JSON bodies, and each
// event of the event streams against the schema its name maps to. Each
// route is called at least once, with its success and some of its
// errors (a bad key, an unknown id, bad JSON, a body not sent as JSON).
func TestResponsesMatchTheDescription(t *testing.T) {
	spec, err := spectest.Load()
	if err != nil {
		t.Fatal(err)
	}
	c := &specClient{t: t, spec: spec, base: startSpecStack(t), called: map[string]bool{}}

	t.Run("ops", func(t *testing.T) { c.t = t; specOps(c) })
	t.Run("chat", func(t *testing.T) { c.t = t; specChat(c) })
	t.Run("kb", func(t *testing.T) { c.t = t; specKB(c) })
	t.Run("admin", func(t *testing.T) { c.t = t; specAdmin(c) })
	t.Run("usage", func(t *testing.T) { c.t = t; specUsage(c) })
	t.Run("openai", func(t *testing.T) { c.t = t; specOpenAI(c) })
	t.Run("codec", func(t *testing.T) { c.t = t; specCodec(c) })
	c.t = t
	for _, op := range spec.Operations() {
		if !c.called[op] {
			t.Errorf("%s is described but no call of this test checked it", op)
		}
	}
}

func specOps(c *specClient) {
	c.do(specCall{method: "GET", path: "/healthz"}, 200)
	c.do(specCall{method: "GET", path: "/readyz"}, 200)
	c.do(specCall{method: "GET", path: "/metrics"}, 200)
	doc := c.do(specCall{method: "GET", path: "/openapi.json"}, 200)
	c.do(specCall{method: "GET", path: "/openapi.json", header: map[string]string{"If-None-Match": doc.resp.Header.Get("ETag")}}, 304)
}

// specChat runs chat requests through /v1/chat, their status, resume,
// cancel and session.
func specChat(c *specClient) {
	t := c.t
	session := fmt.Sprintf("spec-%d", time.Now().UnixNano())
	ans := c.do(specCall{method: "POST", path: "/v1/chat", key: "k-acme",
		body: `{"query":"What is a token bucket?","max_tokens":24,"session_id":"` + session + `"}`}, 200)
	if len(ans.events) < 2 || ans.events[0].Event != events.TypeAccepted || !events.Terminal(ans.events[len(ans.events)-1].Event) {
		t.Fatalf("the stream is not accepted … end: %+v", ans.events)
	}
	id := ans.resp.Header.Get("X-Request-ID")
	last := ans.events[len(ans.events)-1].ID

	c.do(specCall{method: "POST", path: "/v1/chat", key: "k-acme", body: `{"query": "hi"`}, 400)
	c.do(specCall{method: "POST", path: "/v1/chat", key: "k-acme", body: `{"query":"  "}`}, 400)
	c.do(specCall{method: "POST", path: "/v1/chat", key: "k-nobody", body: `{"query":"hi"}`}, 401)
	c.do(specCall{method: "POST", path: "/v1/chat", key: "k-acme", body: "query=hi", contentType: "text/plain"}, 415)
	c.do(specCall{method: "POST", path: "/v1/chat", key: "k-acme", body: `{"query":"` + strings.Repeat("a", 70<<10) + `"}`}, 413)
	idem := map[string]string{"Idempotency-Key": "spec-" + session}
	c.do(specCall{method: "POST", path: "/v1/chat", key: "k-acme", header: idem, body: `{"query":"What is a queue?","max_tokens":8}`}, 200)
	c.do(specCall{method: "POST", path: "/v1/chat", key: "k-acme", header: idem, body: `{"query":"Something else?","max_tokens":8}`}, 422)

	c.do(specCall{method: "GET", path: "/v1/requests/" + id, key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/requests/chat-123", key: "k-acme"}, 400)
	c.do(specCall{method: "GET", path: "/v1/requests/chat-01JABCDEFGHJKMNPQRSTVWXYZ0", key: "k-acme"}, 404)
	c.do(specCall{method: "GET", path: "/v1/requests/" + id, key: "k-nobody"}, 401)
	replay := c.do(specCall{method: "GET", path: "/v1/requests/" + id + "/events", key: "k-acme"}, 200)
	if len(replay.events) != len(ans.events) {
		t.Errorf("the replay has %d events, the stream had %d", len(replay.events), len(ans.events))
	}
	c.do(specCall{method: "GET", path: "/v1/requests/" + id + "/events", key: "k-acme", header: map[string]string{"Last-Event-ID": last}}, 204)
	c.do(specCall{method: "GET", path: "/v1/requests/" + id + "/events", key: "k-acme", header: map[string]string{"Last-Event-ID": "x"}}, 400)
	c.do(specCall{method: "DELETE", path: "/v1/requests/" + id, key: "k-acme"}, 409)
	specCancel(c)
	specCachedAnswer(c)

	c.do(specCall{method: "GET", path: "/v1/sessions/" + session, key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/sessions/bad!id", key: "k-acme"}, 400)
	c.do(specCall{method: "DELETE", path: "/v1/sessions/" + session, key: "k-acme"}, 204)
	c.do(specCall{method: "GET", path: "/v1/sessions/" + session, key: "k-acme"}, 404)
	c.do(specCall{method: "DELETE", path: "/v1/sessions/" + session, key: "k-acme"}, 404)
}

// specCancel cancels a request while it streams: 202, and the stream, read
// meanwhile, ends with an error event of reason cancelled.
func specCancel(c *specClient) {
	t := c.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, resp := c.send(ctx, specCall{method: "POST", path: "/v1/chat", key: "k-acme",
		body: `{"query":"Tell me about Redis streams","max_tokens":1000}`})
	id := resp.Header.Get("X-Request-ID")
	streamed := make(chan specAnswer, 1)
	go func() {
		evs, body, err := c.spec.CheckResponse(req, resp)
		if err != nil {
			t.Error(err)
		}
		streamed <- specAnswer{resp: resp, body: body, events: evs}
	}()
	c.do(specCall{method: "DELETE", path: "/v1/requests/" + id, key: "k-acme"}, 202)
	ans := <-streamed
	var f events.Failure
	if n := len(ans.events); n == 0 || ans.events[n-1].Event != events.TypeError || ans.events[n-1].Decode(&f) != nil || f.Reason != request.ReasonCancelled {
		t.Fatalf("the cancelled stream ended with %+v", ans.events)
	}
}

// specCachedAnswer asks the same question twice of a kb whose answers
// are cached (answer_cache.kbs), with room for the whole answer (a cut
// one is not cached): the second answer's done event is the cache's.
func specCachedAnswer(c *specClient) {
	t := c.t
	c.do(specCall{method: "POST", path: "/v1/kb/it-cached/documents",
		body: `{"id":"spec","text":"The spec document: a token bucket refills at a steady rate."}`}, 200)
	q := fmt.Sprintf(`{"query":"What refills at a steady rate, %d?","kb":"it-cached","max_tokens":1000}`, time.Now().UnixNano())
	c.do(specCall{method: "POST", path: "/v1/chat", body: q}, 200)
	again := c.do(specCall{method: "POST", path: "/v1/chat", body: q}, 200)
	var done events.Done
	if n := len(again.events); n == 0 || again.events[n-1].Decode(&done) != nil || !done.Cached {
		t.Fatalf("the second answer is not the cache's: %+v", again.events)
	}
}

// specKB ingests into a kb of the caller's own, pages it and deletes
// from it.
func specKB(c *specClient) {
	t := c.t
	kb := fmt.Sprintf("spec-kb-%d", time.Now().UnixNano())
	c.do(specCall{method: "GET", path: "/v1/kb", key: keyAlice}, 200)
	c.do(specCall{method: "GET", path: "/v1/kb", key: "k-nobody"}, 401)
	docs := `{"documents":[{"id":"a","title":"Buckets","text":"A token bucket refills at a steady rate.","metadata":{"lang":"en"}},` +
		`{"id":"b","text":"# Queues\n\nA fair queue serves tenants by weight."}]}`
	c.do(specCall{method: "POST", path: "/v1/kb/" + kb + "/documents", key: keyAlice, body: docs}, 200)
	c.do(specCall{method: "POST", path: "/v1/kb/" + kb + "/documents", key: keyAlice, body: `{}`}, 400)
	c.do(specCall{method: "POST", path: "/v1/kb/" + kb + "/documents", key: "k-acme", body: docs}, 403)
	c.do(specCall{method: "POST", path: "/v1/kb/sluice-docs/documents", key: keyAlice, body: docs}, 403)
	c.do(specCall{method: "POST", path: "/v1/kb/" + kb + "/documents", key: keyAlice, body: docs, contentType: "text/plain"}, 415)
	page := c.do(specCall{method: "GET", path: "/v1/kb/" + kb + "?limit=1", key: keyAlice}, 200)
	var first struct {
		NextCursor string `json:"next_cursor"`
	}
	page.decode(t, &first)
	if first.NextCursor == "" {
		t.Fatalf("a page of 1 of 2 documents has no next_cursor: %s", page.body)
	}
	c.do(specCall{method: "GET", path: "/v1/kb/" + kb + "?limit=1&cursor=" + first.NextCursor, key: keyAlice}, 200)
	c.do(specCall{method: "GET", path: "/v1/kb/" + kb + "?limit=0", key: keyAlice}, 400)
	c.do(specCall{method: "GET", path: "/v1/kb/sluice-docs?limit=2", key: keyAlice}, 200)
	c.do(specCall{method: "GET", path: "/v1/kb/no-such-kb", key: keyAlice}, 404)
	c.do(specCall{method: "DELETE", path: "/v1/kb/" + kb + "/documents/a", key: keyAlice}, 200)
	c.do(specCall{method: "DELETE", path: "/v1/kb/" + kb + "/documents/a", key: keyAlice}, 404)
	c.do(specCall{method: "DELETE", path: "/v1/kb/sluice-docs/documents/a", key: keyAlice}, 403)
}

// specAdmin reads and writes the policy, the queue, the managed keys and
// the bans.
func specAdmin(c *specClient) {
	t := c.t
	policy := c.do(specCall{method: "GET", path: "/v1/admin/limits", key: specAdminKey}, 200)
	c.do(specCall{method: "GET", path: "/v1/admin/limits"}, 401)
	c.do(specCall{method: "GET", path: "/v1/admin/limits", key: "k-acme"}, 403)
	c.do(specCall{method: "PUT", path: "/v1/admin/limits", key: specAdminKey, body: string(policy.body)}, 200)
	c.do(specCall{method: "PUT", path: "/v1/admin/limits", key: specAdminKey, body: `{"enabled":true,"default_tier":"none","tiers":{},"pools":{}}`}, 400)
	c.do(specCall{method: "PUT", path: "/v1/admin/limits", key: specAdminKey, body: string(policy.body), contentType: "text/plain"}, 415)
	c.do(specCall{method: "GET", path: "/v1/admin/queue", key: specAdminKey}, 200)

	created := c.do(specCall{method: "POST", path: "/v1/admin/keys", key: specAdminKey, body: `{"tenant":"spec-co","user":"sam","scopes":["chat","ingest"]}`}, 201)
	var key struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	created.decode(t, &key)
	c.do(specCall{method: "POST", path: "/v1/admin/keys", key: specAdminKey, body: `{"tenant":"spec-co","scopes":["root"]}`}, 400)
	c.do(specCall{method: "POST", path: "/v1/admin/keys", key: specAdminKey, body: `{"tenant":"spec-co","tier":"no-such-tier"}`}, 400)
	// The new key works before it is revoked, and is listed as used.
	c.do(specCall{method: "GET", path: "/v1/kb", key: key.Key}, 200)
	c.do(specCall{method: "GET", path: "/v1/admin/keys?tenant=spec-co", key: specAdminKey}, 200)
	c.do(specCall{method: "DELETE", path: "/v1/admin/keys/" + key.ID, key: specAdminKey}, 200)
	c.do(specCall{method: "DELETE", path: "/v1/admin/keys/aaaaaaaaaaaa", key: specAdminKey}, 404)
	c.do(specCall{method: "DELETE", path: "/v1/admin/keys/nope", key: specAdminKey}, 400)

	c.do(specCall{method: "GET", path: "/v1/admin/bans", key: specAdminKey}, 200)
	c.do(specCall{method: "DELETE", path: "/v1/admin/bans/ip/192.0.2.1", key: specAdminKey}, 404)
	c.do(specCall{method: "DELETE", path: "/v1/admin/bans/nope/x", key: specAdminKey}, 400)
}

// specUsage reads the usage ledger: a tenant's own and across tenants,
// JSON and CSV, and refusals.
func specUsage(c *specClient) {
	c.do(specCall{method: "GET", path: "/v1/usage", key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/usage?group_by=model&format=csv", key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/usage?group_by=tenant", key: "k-acme"}, 400)
	c.do(specCall{method: "GET", path: "/v1/usage"}, 401)
	c.do(specCall{method: "GET", path: "/v1/admin/usage?group_by=tenant", key: specAdminKey}, 200)
	c.do(specCall{method: "GET", path: "/v1/admin/usage?tenant=acme&format=csv", key: specAdminKey}, 200)
	c.do(specCall{method: "GET", path: "/v1/admin/usage?from=2026-13-01", key: specAdminKey}, 400)
	c.do(specCall{method: "GET", path: "/v1/admin/usage", key: "k-acme"}, 403)
}

// specOpenAI calls the OpenAI-compatible routes, streamed and not.
func specOpenAI(c *specClient) {
	c.do(specCall{method: "GET", path: "/v1/models", key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/models", key: "k-nobody"}, 401)
	msgs := `"messages":[{"role":"user","content":"What is a token bucket?"}]`
	c.do(specCall{method: "POST", path: "/v1/chat/completions", key: "k-acme", body: `{"model":"sluice-rag","max_tokens":16,` + msgs + `}`}, 200)
	streamed := c.do(specCall{method: "POST", path: "/v1/chat/completions", key: "k-acme",
		body: `{"model":"sluice-rag","max_tokens":16,"stream":true,"stream_options":{"include_usage":true},` + msgs + `}`}, 200)
	if n := len(streamed.events); n < 2 || streamed.events[n-1].Data != "[DONE]" {
		c.t.Fatalf("the streamed completion does not end with [DONE]: %+v", streamed.events)
	}
	c.do(specCall{method: "POST", path: "/v1/chat/completions", key: "k-acme", body: `{"model":"sluice-rag","logprobs":true,` + msgs + `}`}, 400)
	c.do(specCall{method: "POST", path: "/v1/chat/completions", key: "k-acme", body: `{"model":"no-such-model",` + msgs + `}`}, 404)
	c.do(specCall{method: "POST", path: "/v1/chat/completions", key: "k-nobody", body: `{"model":"sluice-rag",` + msgs + `}`}, 401)
	c.do(specCall{method: "POST", path: "/v1/chat/completions", key: "k-acme", body: `{"model":"sluice-rag"`}, 400)

	c.do(specCall{method: "POST", path: "/v1/responses", key: "k-acme", body: `{"model":"sluice-rag","max_output_tokens":16,"input":"What is a token bucket?"}`}, 200)
	told := c.do(specCall{method: "POST", path: "/v1/responses", key: "k-acme",
		body: `{"model":"sluice-rag","max_output_tokens":16,"stream":true,"input":[{"role":"user","content":"What is a token bucket?"}]}`}, 200)
	if n := len(told.events); n < 4 || told.events[0].Event != "response.created" || told.events[n-1].Event != "response.incomplete" {
		c.t.Fatalf("the streamed response is not created … incomplete: %+v", told.events)
	}
	stored := c.do(specCall{method: "POST", path: "/v1/responses", key: "k-acme", body: `{"model":"sluice-rag","max_output_tokens":8,"input":"What is a queue?"}`}, 200)
	var r struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(stored.body, &r); err != nil || r.ID == "" {
		c.t.Fatalf("the stored response has no id: %s (%v)", stored.body, err)
	}
	c.do(specCall{method: "GET", path: "/v1/responses/" + r.ID, key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/responses/" + r.ID + "?stream=true&starting_after=2", key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/responses/" + r.ID + "?stream=true&starting_after=-1", key: "k-acme"}, 400)
	c.do(specCall{method: "POST", path: "/v1/responses/" + r.ID + "/cancel", key: "k-acme"}, 400)
	bg := c.do(specCall{method: "POST", path: "/v1/responses", key: "k-acme", body: `{"model":"sluice-rag","max_output_tokens":8,"background":true,"input":"What is a queue?"}`}, 200)
	var b struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(bg.body, &b); err != nil || b.ID == "" {
		c.t.Fatalf("the background response has no id: %s (%v)", bg.body, err)
	}
	c.do(specCall{method: "POST", path: "/v1/responses/" + b.ID + "/cancel", key: "k-acme"}, 200)
	c.do(specCall{method: "POST", path: "/v1/responses/resp_nope/cancel", key: "k-acme"}, 404)
	c.do(specCall{method: "GET", path: "/v1/responses/" + r.ID, key: "k-nobody"}, 401)
	c.do(specCall{method: "POST", path: "/v1/responses", key: "k-acme", body: `{"model":"sluice-rag","input":"hi","previous_response_id":"resp_nope"}`}, 404)
	c.do(specCall{method: "GET", path: "/v1/responses/" + r.ID + "/input_items?limit=1&order=asc", key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/responses/" + r.ID + "/input_items?limit=0", key: "k-acme"}, 400)
	c.do(specCall{method: "GET", path: "/v1/responses/resp_nope/input_items", key: "k-acme"}, 404)
	c.do(specCall{method: "DELETE", path: "/v1/responses/" + r.ID, key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/responses/" + r.ID, key: "k-acme"}, 404)
	c.do(specCall{method: "DELETE", path: "/v1/responses/" + r.ID, key: "k-acme"}, 404)
	c.do(specCall{method: "POST", path: "/v1/responses", key: "k-acme", body: `{"model":"sluice-rag","input":"hi","background":true,"store":false}`}, 400)
	c.files()
	c.do(specCall{method: "POST", path: "/v1/responses", key: "k-acme", body: `{"model":"no-such-model","input":"hi"}`}, 404)
	c.do(specCall{method: "POST", path: "/v1/responses", key: "k-nobody", body: `{"model":"sluice-rag","input":"hi"}`}, 401)

	model := stack.cfg.Embedding.Model
	c.do(specCall{method: "POST", path: "/v1/embeddings", key: "k-acme", body: `{"model":"` + model + `","input":["token bucket","fair queue"]}`}, 200)
	c.do(specCall{method: "POST", path: "/v1/embeddings", key: "k-acme", body: `{"model":"` + model + `","input":"token bucket","encoding_format":"base64"}`}, 200)
	c.do(specCall{method: "POST", path: "/v1/embeddings", key: "k-acme", body: `{"model":"no-such-model","input":"x"}`}, 404)
	c.do(specCall{method: "POST", path: "/v1/embeddings", key: "k-acme", body: `{"model":"` + model + `","input":[[1,2,3]]}`}, 400)
	c.do(specCall{method: "POST", path: "/v1/embeddings", key: "k-acme", body: `{"model":"` + model + `","input":"x"}`, contentType: "text/plain"}, 415)
}

// specCodec seals and opens a payload through the codec endpoint, as the
// Temporal CLI and UI call it.
func specCodec(c *specClient) {
	t := c.t
	plain := `{"payloads":[{"metadata":{"encoding":"anNvbi9wbGFpbg=="},"data":"InNwZWMi"}]}`
	sealed := c.do(specCall{method: "POST", path: "/codec/encode", key: specAdminKey, body: plain}, 200)
	if strings.Contains(string(sealed.body), "InNwZWMi") {
		t.Fatalf("the encoded payload is in the clear: %s", sealed.body)
	}
	opened := c.do(specCall{method: "POST", path: "/codec/decode", key: specAdminKey, body: string(sealed.body)}, 200)
	if !strings.Contains(string(opened.body), "InNwZWMi") {
		t.Fatalf("the decoded payload is not the one encoded: %s", opened.body)
	}
	c.do(specCall{method: "POST", path: "/codec/decode", body: string(sealed.body)}, 401)
	c.do(specCall{method: "POST", path: "/codec/decode", key: "k-acme", body: string(sealed.body)}, 403)
	c.do(specCall{method: "POST", path: "/codec/decode", key: specAdminKey, body: `{"payloads":`}, 400)
	preflight := map[string]string{"Origin": specUIOrigin, "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "authorization,content-type,x-namespace"}
	for _, path := range []string{"/codec/decode", "/codec/encode"} {
		ans := c.do(specCall{method: "OPTIONS", path: path, header: preflight}, 204)
		if got := ans.resp.Header.Get("Access-Control-Allow-Origin"); got != specUIOrigin {
			t.Errorf("OPTIONS %s: Access-Control-Allow-Origin %q", path, got)
		}
		if !slices.Contains(strings.Split(ans.resp.Header.Get("Access-Control-Allow-Methods"), ","), "POST") {
			t.Errorf("OPTIONS %s: Access-Control-Allow-Methods %q", path, ans.resp.Header.Get("Access-Control-Allow-Methods"))
		}
	}
}

// files calls every /v1/files route.
func (c *specClient) files() {
	upload := func(content string) specCall {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", "batch.jsonl")
		_, _ = io.WriteString(fw, content)
		_ = mw.WriteField("purpose", "batch")
		_ = mw.Close()
		return specCall{method: "POST", path: "/v1/files", key: "k-acme", body: body.String(), contentType: mw.FormDataContentType()}
	}
	up := c.do(upload(batchLines(2)), 200)
	var f struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(up.body, &f); err != nil || f.ID == "" {
		c.t.Fatalf("the file has no id: %s (%v)", up.body, err)
	}
	c.do(upload(batchLines(3, 2)), 400)
	c.do(specCall{method: "POST", path: "/v1/files", key: "k-acme", body: `{}`}, 415)
	c.do(specCall{method: "GET", path: "/v1/files?purpose=batch&limit=5", key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/files?limit=0", key: "k-acme"}, 400)
	c.do(specCall{method: "GET", path: "/v1/files/" + f.ID, key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/files/" + f.ID + "/content", key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/files/" + f.ID, key: "k-nobody"}, 401)
	c.do(specCall{method: "DELETE", path: "/v1/files/" + f.ID, key: "k-acme"}, 200)
	c.do(specCall{method: "GET", path: "/v1/files/" + f.ID + "/content", key: "k-acme"}, 404)
	c.do(specCall{method: "DELETE", path: "/v1/files/" + f.ID, key: "k-acme"}, 404)
}
