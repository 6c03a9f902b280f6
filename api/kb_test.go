package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/semaphore"
)

// newKBServer is a test server with a kb store and an ingester.
func newKBServer(t *testing.T, mod func(*config.Config)) *Server {
	t.Helper()
	srv, _, _ := newTestServerWith(t, mod, withKBs(t))
	return srv
}

// withKBs gives a test server a kb store, an ingester and ingestion
// permits of the test's own, as the app builds them from the config.
func withKBs(t *testing.T) func(*redis.Client, *Options) {
	return func(rdb *redis.Client, o *Options) {
		store := kbstore.New(rdb, kbstore.Options{Prefix: "t:" + t.Name() + ":", MaxKBMemory: o.Config.Retrieval.KBMemoryBytes})
		o.KBs, o.Ingester = store, &ingest.Ingester{Store: store, Embedder: embed.NewLocal(embed.LocalOptions{}),
			MaxMetadataBytes: o.Config.Ingest.MaxMetadataBytes}
		slots, err := semaphore.New(rdb, semaphore.Options{Key: "t:" + t.Name() + ":ingest", Limit: o.Config.Ingest.MaxConcurrent,
			GroupLimit: o.Config.Ingest.TenantPermits(), Lease: o.Config.Ingest.Lease})
		if err != nil {
			t.Fatal(err)
		}
		o.IngestSlots = slots
	}
}

func TestKBLifecycle(t *testing.T) {
	srv := newKBServer(t, nil)
	rec := call(srv, "POST", "/v1/kb/facts/documents", `{"id":"otters","text":"# Sea otters\n\nSea otters hold hands while they sleep."}`)
	if rec.Code != 200 {
		t.Fatalf("post: %d %s", rec.Code, rec.Body)
	}
	var res ingest.Result
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || res.Version != 1 || len(res.Docs) != 1 || !res.Docs[0].Changed {
		t.Fatalf("post result %s (%v)", rec.Body, err)
	}
	rec = call(srv, "POST", "/v1/kb/facts/documents", `{"documents":[{"id":"bread","title":"Sourdough","text":"Sourdough rises with wild yeast."},{"id":"otters","text":"# Sea otters\n\nSea otters hold hands while they sleep."}]}`)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"version":2`) {
		t.Fatalf("batch: %d %s", rec.Code, rec.Body)
	}
	rec = call(srv, "GET", "/v1/kb/facts", "")
	var info kbstore.Info
	if err := json.Unmarshal(rec.Body.Bytes(), &info); err != nil || rec.Code != 200 || info.Version != 2 || len(info.Documents) != 2 || info.Chunks != 2 {
		t.Fatalf("get: %d %s", rec.Code, rec.Body)
	}
	if info.Documents[1].Title != "Sea otters" {
		t.Fatalf("the markdown heading did not become the title: %+v", info.Documents[1])
	}
	if rec := call(srv, "GET", "/v1/kb", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"facts"`) {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	// A chat request may now name the kb: it passes the kb check and
	// reaches the workflow start (which this test's client refuses).
	assertJSONError(t, call(srv, "POST", "/v1/chat", `{"query":"otters?","kb":"facts"}`), 503, "unavailable")
	assertJSONError(t, call(srv, "POST", "/v1/chat", `{"query":"otters?","kb":"nope"}`), 400, "unknown_kb")

	if rec := call(srv, "DELETE", "/v1/kb/facts/documents/otters", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"version":3`) {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	assertJSONError(t, call(srv, "DELETE", "/v1/kb/facts/documents/otters", ""), 404, "not_found")
	assertJSONError(t, call(srv, "GET", "/v1/kb/nope", ""), 404, "not_found")
}

func TestBadDocumentsRefused(t *testing.T) {
	srv := newKBServer(t, func(c *config.Config) { c.Ingest.MaxDocuments = 2 })
	for name, tc := range map[string]struct{ path, body, code string }{
		"bad kb name":             {"/v1/kb/bad%20name/documents", `{"id":"a","text":"x"}`, "bad_kb"},
		"nothing":                 {"/v1/kb/facts/documents", `{}`, "bad_documents"},
		"both":                    {"/v1/kb/facts/documents", `{"id":"a","text":"x","documents":[{"id":"b","text":"y"}]}`, "bad_documents"},
		"empty text":              {"/v1/kb/facts/documents", `{"id":"a","text":"  "}`, "bad_document"},
		"id with hash":            {"/v1/kb/facts/documents", `{"id":"a#1","text":"x"}`, "bad_document"},
		"duplicate ids":           {"/v1/kb/facts/documents", `{"documents":[{"id":"a","text":"x"},{"id":"a","text":"y"}]}`, "bad_document"},
		"unknown field":           {"/v1/kb/facts/documents", `{"id":"a","text":"x","body":"y"}`, "bad_json"},
		"too many":                {"/v1/kb/facts/documents", `{"documents":[{"id":"a","text":"x"},{"id":"b","text":"y"},{"id":"c","text":"z"}]}`, "too_many_documents"},
		"malformed":               {"/v1/kb/facts/documents", `{"id":`, "bad_json"},
		"one bad of many":         {"/v1/kb/facts/documents", `{"documents":[{"id":"a","text":"x"},{"id":"","text":"y"}]}`, "bad_document"},
		"metadata over its bytes": {"/v1/kb/facts/documents", `{"id":"a","text":"x","metadata":{"k":"` + strings.Repeat("v", 8<<10) + `"}}`, "bad_document"},
	} {
		rec := call(srv, "POST", tc.path, tc.body)
		status := 400
		if tc.code == "too_many_documents" {
			status = 413
		}
		t.Run(name, func(t *testing.T) { assertJSONError(t, rec, status, tc.code) })
	}
	if v, _ := srv.kbStore.Version(context.Background(), kbref.Own("acme", "facts").Key()); v != 0 {
		t.Fatalf("bad input changed the kb (version %d)", v)
	}
}

// With every ingestion permit taken, a request waits ingest.max_wait and
// is told to come back: 503 + Retry-After.
func TestIngestBusyIs503(t *testing.T) {
	srv := newKBServer(t, func(c *config.Config) {
		c.Ingest.MaxConcurrent = 1
		c.Ingest.MaxWait = 100 * time.Millisecond
	})
	p, err := srv.ingestSlots.Acquire(context.Background(), "globex", "other", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(context.Background())
	rec := call(srv, "POST", "/v1/kb/facts/documents", `{"id":"a","text":"some text"}`)
	assertJSONError(t, rec, http.StatusServiceUnavailable, "ingest_busy")
	if rec.Header().Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
}

// countingBody counts the reads of a request body.
type countingBody struct {
	r     io.Reader
	reads atomic.Int32
}

func (b *countingBody) Read(p []byte) (int, error) {
	b.reads.Add(1)
	return b.r.Read(p)
}

// A batch that gets no ingestion permit is refused before its body is
// read: large bodies in memory are bounded by the permits.
func TestIngestBodyIsReadOnlyWithAPermit(t *testing.T) {
	srv := newKBServer(t, func(c *config.Config) {
		c.Ingest.MaxConcurrent = 1
		c.Ingest.MaxWait = 50 * time.Millisecond
	})
	p, err := srv.ingestSlots.Acquire(context.Background(), "globex", "other", 0)
	if err != nil {
		t.Fatal(err)
	}
	body := &countingBody{r: strings.NewReader(`{"id":"a","text":"` + strings.Repeat("x", 1<<20) + `"}`)}
	req := httptest.NewRequest("POST", "/v1/kb/facts/documents", body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k-acme")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	assertJSONError(t, rec, http.StatusServiceUnavailable, "ingest_busy")
	if n := body.reads.Load(); n != 0 {
		t.Fatalf("the body was read %d times without a permit", n)
	}
	_ = p.Release(context.Background())
	rec = call(srv, "POST", "/v1/kb/facts/documents", `{"id":"a","text":"some text"}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("with the permit free: %d %s", rec.Code, rec.Body)
	}
}

// A tenant's kbs hold what its plan allows: a batch that would pass the
// quota's documents or bytes is refused (403 ingest_quota_exceeded), a
// new revision of a stored document takes no more of the count, and
// deleting makes room again.
func TestIngestQuota(t *testing.T) {
	srv := newKBServer(t, func(c *config.Config) {
		vip := c.Limits.Tiers["vip"]
		vip.IngestQuota = policy.IngestQuota{Documents: 2, Bytes: 400}
		c.Limits.Tiers["vip"] = vip
	})
	ok := func(body string) {
		t.Helper()
		if rec := call(srv, "POST", "/v1/kb/facts/documents", body); rec.Code != 200 {
			t.Fatalf("post %s: %d %s", body, rec.Code, rec.Body)
		}
	}
	ok(`{"documents":[{"id":"a","text":"Alpha."},{"id":"b","text":"Beta."}]}`)
	ok(`{"id":"a","text":"Alpha, revised."}`) // a new revision is not a new document
	// Another kb of the tenant counts too.
	assertJSONError(t, call(srv, "POST", "/v1/kb/other/documents", `{"id":"c","text":"Gamma."}`), 403, "ingest_quota_exceeded")
	if rec := call(srv, "DELETE", "/v1/kb/facts/documents/b", ""); rec.Code != 200 {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	ok(`{"id":"c","text":"Gamma."}`)
	long := strings.Repeat("word ", 100)
	if rec := call(srv, "DELETE", "/v1/kb/facts/documents/c", ""); rec.Code != 200 {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	assertJSONError(t, call(srv, "POST", "/v1/kb/facts/documents", `{"id":"d","text":"`+long+`"}`), 403, "ingest_quota_exceeded")
	// Metadata is stored, so it is counted: short text, long metadata.
	assertJSONError(t, call(srv, "POST", "/v1/kb/facts/documents",
		`{"id":"d","text":"Delta.","metadata":{"note":"`+long+`"}}`), 403, "ingest_quota_exceeded")
}

// GET /v1/kb/:kb answers a page at a time: ?limit= documents after
// ?cursor=, the next page's cursor in next_cursor until the last; bad
// values are a 400 naming them.
func TestKBPages(t *testing.T) {
	srv := newKBServer(t, nil)
	var docs []string
	for i := range 5 {
		docs = append(docs, fmt.Sprintf(`{"id":"doc-%d","text":"Text number %d."}`, i, i))
	}
	if rec := call(srv, "POST", "/v1/kb/facts/documents", `{"documents":[`+strings.Join(docs, ",")+`]}`); rec.Code != 200 {
		t.Fatalf("post: %d %s", rec.Code, rec.Body)
	}
	var ids []string
	path := "/v1/kb/facts?limit=2"
	for range 5 {
		rec := call(srv, "GET", path, "")
		var page kbView
		if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || rec.Code != 200 || page.DocumentCount != 5 || len(page.Documents) > 2 {
			t.Fatalf("get %s: %d %s", path, rec.Code, rec.Body)
		}
		for _, d := range page.Documents {
			ids = append(ids, d.ID)
		}
		if page.NextCursor == "" {
			break
		}
		path = "/v1/kb/facts?limit=2&cursor=" + page.NextCursor
	}
	if strings.Join(ids, ",") != "doc-0,doc-1,doc-2,doc-3,doc-4" {
		t.Fatalf("pages gave %v", ids)
	}
	if rec := call(srv, "GET", "/v1/kb/facts", ""); !strings.Contains(rec.Body.String(), `"document_count":5`) || strings.Contains(rec.Body.String(), "next_cursor") {
		t.Fatalf("default page: %s", rec.Body)
	}
	for _, q := range []string{"limit=0", "limit=201", "limit=ten", "limit=-1", "cursor=!!!", "cursor=" + strings.Repeat("QUFB", 100)} {
		rec := call(srv, "GET", "/v1/kb/facts?"+q, "")
		code := "bad_limit"
		if strings.HasPrefix(q, "cursor") {
			code = "bad_cursor"
		}
		t.Run(q, func(t *testing.T) { assertJSONError(t, rec, 400, code) })
	}
	// A query that does not parse is refused, not read as no cursor (the
	// first page) or no limit.
	for _, q := range []string{"cursor=%%%", "limit=2&cursor=%zz", "limit=2;cursor=x"} {
		rec := call(srv, "GET", "/v1/kb/facts?"+q, "")
		t.Run(q, func(t *testing.T) { assertJSONError(t, rec, 400, "bad_query_string") })
	}
}

// One tenant holding every ingestion permit it may does not hold up
// another's: its own next batch waits for a permit, the other tenant's
// goes through at once.
func TestOneTenantCannotTakeEveryIngestPermit(t *testing.T) {
	srv := newKBServer(t, func(c *config.Config) {
		c.Ingest.MaxConcurrent, c.Ingest.MaxConcurrentPerTenant, c.Ingest.MaxWait = 4, 2, 200*time.Millisecond
		c.Auth.APIKeys = append(c.Auth.APIKeys, config.APIKey{Key: "k-globex", Tenant: "globex", Tier: "vip", Scopes: []string{"ingest"}})
	})
	ctx := context.Background()
	for i := range 2 {
		p, err := srv.ingestSlots.Acquire(ctx, "acme", fmt.Sprint("acme-upload-", i), 0)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release(ctx)
	}
	assertJSONError(t, call(srv, "POST", "/v1/kb/facts/documents", `{"id":"a","text":"Acme's third upload."}`), http.StatusServiceUnavailable, "ingest_busy")
	req := httptest.NewRequest("POST", "/v1/kb/facts/documents", strings.NewReader(`{"id":"g","text":"Globex's upload."}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k-globex")
	rec := httptest.NewRecorder()
	start := time.Now()
	srv.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || time.Since(start) > 150*time.Millisecond {
		t.Fatalf("globex's upload beside acme's: %d after %v: %s", rec.Code, time.Since(start), rec.Body)
	}
}

// One process ingests at most ingest.max_concurrent_per_process batches
// at once, whatever shared permits are free: a batch beyond waits for a
// slot and is refused 503 ingest_busy at ingest.max_wait, before its body
// is read; a slot given back is taken by the next.
func TestOneProcessIngestsItsShareAtOnce(t *testing.T) {
	srv := newKBServer(t, func(c *config.Config) {
		c.Ingest.MaxConcurrentPerProcess, c.Ingest.MaxWait = 1, 200*time.Millisecond
	})
	srv.ingestHere <- struct{}{} // a batch in flight
	start := time.Now()
	assertJSONError(t, call(srv, "POST", "/v1/kb/facts/documents", `{"id":"a","text":"A second batch."}`), http.StatusServiceUnavailable, "ingest_busy")
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Fatalf("refused after %v, before ingest.max_wait", took)
	}
	<-srv.ingestHere
	if rec := call(srv, "POST", "/v1/kb/facts/documents", `{"id":"a","text":"A second batch."}`); rec.Code != http.StatusOK {
		t.Fatalf("with the slot free: %d %s", rec.Code, rec.Body)
	}
	if len(srv.ingestHere) != 0 {
		t.Fatal("the batch kept its slot")
	}
}

// A batch that would make a kb need more memory than a worker holds for
// knowledge bases is refused whole with 413 kb_too_large, saying what it
// would need and the limit; the kb stays as it was and can still grow
// within the limit.
func TestIngestPastTheMemoryBudgetIs413(t *testing.T) {
	srv := newKBServer(t, func(c *config.Config) { c.Retrieval.KBMemoryBytes = 1 << 20 })
	var words []string
	for i := range 12000 {
		words = append(words, fmt.Sprintf("word%d", i%3000))
	}
	doc := func(id string) string { return `{"id":"` + id + `","text":"` + strings.Join(words, " ") + `"}` }
	if rec := call(srv, "POST", "/v1/kb/facts/documents", doc("a")); rec.Code != 200 {
		t.Fatalf("first document: %d %s", rec.Code, rec.Body)
	}
	rec := call(srv, "POST", "/v1/kb/facts/documents", doc("b"))
	assertJSONError(t, rec, 413, request.ReasonKBTooLarge)
	if msg := rec.Body.String(); !strings.Contains(msg, `knowledge base \"facts\" would need about`) || !strings.Contains(msg, "more than the 1.0 MiB a worker holds") {
		t.Fatalf("refusal %s: want what the kb would need and the limit", msg)
	}
	rec = call(srv, "GET", "/v1/kb/facts", "")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"version":1`) {
		t.Fatalf("after the refusal: %d %s", rec.Code, rec.Body)
	}
	if rec := call(srv, "POST", "/v1/kb/facts/documents", `{"id":"c","text":"A short one fits."}`); rec.Code != 200 {
		t.Fatalf("a small document after the refusal: %d %s", rec.Code, rec.Body)
	}
}

// Ids are any text a document may have (sluice kb ingest makes
// "guides/setup" of a nested file): each is addressable with standard
// escaping (url.PathEscape, as clients escape a path segment), and a
// literal "/" in the path names the same document.
func TestDocumentIDsWithSlashesAreAddressable(t *testing.T) {
	srv := newKBServer(t, nil)
	ids := []string{"guides/setup", "a/b/c", "50% off", "what?", "x y+z", "plain"}
	var docs []string
	for _, id := range ids {
		b, _ := json.Marshal(map[string]string{"id": id, "text": "Text of " + id + "."})
		docs = append(docs, string(b))
	}
	if rec := call(srv, "POST", "/v1/kb/facts/documents", `{"documents":[`+strings.Join(docs, ",")+`]}`); rec.Code != 200 {
		t.Fatalf("post: %d %s", rec.Code, rec.Body)
	}
	for _, id := range ids {
		rec := call(srv, "DELETE", "/v1/kb/facts/documents/"+url.PathEscape(id), "")
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"deleted":`+strconv.Quote(id)) {
			t.Errorf("delete %q: %d %s", id, rec.Code, rec.Body)
		}
	}
	if rec := call(srv, "POST", "/v1/kb/facts/documents", `{"id":"guides/setup","text":"Again."}`); rec.Code != 200 {
		t.Fatalf("post: %d %s", rec.Code, rec.Body)
	}
	if rec := call(srv, "DELETE", "/v1/kb/facts/documents/guides/setup", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"deleted":"guides/setup"`) {
		t.Errorf("delete by a literal slash: %d %s", rec.Code, rec.Body)
	}
	assertJSONError(t, call(srv, "DELETE", "/v1/kb/facts/documents/guides%2Fsetup", ""), 404, "not_found")
	assertJSONError(t, call(srv, "DELETE", "/v1/kb/facts/documents/", ""), 400, "bad_document_id")
}
