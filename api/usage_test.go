package api

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// usageServer is a server whose ledger (a SQLite file) holds requests of
// acme's alice and bob and of globex's gus, on 2026-12-01 and -02.
func usageServer(t *testing.T) *Server {
	t.Helper()
	ledger, err := usage.OpenSQLite(context.Background(), usage.SQLiteOptions{Path: filepath.Join(t.TempDir(), "usage.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ledger.Close() })
	d1 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for _, e := range []usage.Entry{
		{RequestID: "chat-1", Tenant: "acme", User: "alice", KeyID: "ka", Model: "m1", Pool: "short", Route: "short", PromptTokens: 10, CompletionTokens: 5, Outcome: "done", FinishedAt: d1},
		{RequestID: "chat-2", Tenant: "acme", User: "bob", KeyID: "kb", Model: "m1", Pool: "short", Route: "short", PromptTokens: 20, CompletionTokens: 7, Outcome: "done", FinishedAt: d1.AddDate(0, 0, 1)},
		{RequestID: "chat-3", Tenant: "globex", User: "gus", KeyID: "kg", Model: "m2", Pool: "long", Route: "long", PromptTokens: 1000, CompletionTokens: 1000, Outcome: "done", FinishedAt: d1},
	} {
		if _, err := ledger.Record(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	srv, _, _ := newTestServerWith(t, func(c *config.Config) {
		tenantsConfig(c)
		c.Auth.AdminKey = "root"
	}, func(_ *redis.Client, o *Options) { o.Usage = ledger })
	return srv
}

type usageBody struct {
	Tenant  string      `json:"tenant"`
	From    string      `json:"from"`
	To      string      `json:"to"`
	GroupBy string      `json:"group_by"`
	Rows    []usage.Row `json:"rows"`
}

func decodeUsage(t *testing.T, code int, body string) usageBody {
	t.Helper()
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var b usageBody
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatal(err)
	}
	return b
}

const usageRange = "from=2026-12-01&to=2026-12-03"

// A tenant's key reads its own tenant's usage and nothing of another's,
// whatever it asks for: a tenant parameter and a grouping by tenant are
// not its to use.
func TestUsageIsATenantsOwn(t *testing.T) {
	srv := usageServer(t)
	rec := as(srv, keyAlice, "GET", "/v1/usage?"+usageRange+"&group_by=user", "")
	b := decodeUsage(t, rec.Code, rec.Body.String())
	if b.Tenant != "acme" || len(b.Rows) != 2 || b.Rows[0].Group != "alice" || b.Rows[1].Group != "bob" || b.Rows[1].TotalTokens != 27 {
		t.Fatalf("acme by user: %+v", b)
	}
	rec = as(srv, keyGus, "GET", "/v1/usage?"+usageRange+"&tenant=acme", "")
	b = decodeUsage(t, rec.Code, rec.Body.String())
	if b.Tenant != "globex" || len(b.Rows) != 1 || b.Rows[0].PromptTokens != 1000 {
		t.Fatalf("globex asking for acme's: %+v", b)
	}
	assertJSONError(t, as(srv, keyGus, "GET", "/v1/usage?group_by=tenant", ""), 400, "bad_group_by")
	assertJSONError(t, as(srv, "", "GET", "/v1/usage", ""), 401, "unauthorized")
}

// Bad parameters are a 400 naming the parameter.
func TestUsageRefusesBadParameters(t *testing.T) {
	srv := usageServer(t)
	for q, code := range map[string]string{
		"from=2026-13-01":                  "bad_from",
		"to=yesterday":                     "bad_to",
		"from=2026-12-03&to=2026-12-01":    "bad_from",
		"from=2020-01-01&to=2026-12-01":    "bad_from",
		"group_by=week":                    "bad_group_by",
		"format=xml":                       "bad_format",
		"from=2026-12-01&to=2026-12-01":    "bad_from",
		"group_by=model&format=yaml&to=x1": "bad_to",
	} {
		rec := as(srv, keyAlice, "GET", "/v1/usage?"+q, "")
		assertJSONError(t, rec, 400, code)
		if !strings.HasPrefix(errorMessage(t, rec.Body.Bytes()), strings.TrimPrefix(code, "bad_")+":") {
			t.Errorf("%s: message %q does not name the parameter", q, rec.Body)
		}
	}
}

func errorMessage(t *testing.T, body []byte) string {
	t.Helper()
	var b struct{ Error struct{ Message string } }
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	return b.Error.Message
}

// CSV has a header row and a row per group.
func TestUsageAsCSV(t *testing.T) {
	srv := usageServer(t)
	rec := as(srv, keyBob, "GET", "/v1/usage?"+usageRange+"&format=csv", "")
	if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/csv") {
		t.Fatalf("csv: %d %s %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	rows, err := csv.NewReader(rec.Body).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"tenant", "day", "requests", "answered", "prompt_tokens", "completion_tokens", "cached_tokens", "total_tokens"},
		{"acme", "2026-12-01", "1", "1", "10", "5", "0", "15"},
		{"acme", "2026-12-02", "1", "1", "20", "7", "0", "27"},
	}
	if len(rows) != len(want) || strings.Join(rows[1], ",") != strings.Join(want[1], ",") || strings.Join(rows[0], ",") != strings.Join(want[0], ",") {
		t.Fatalf("csv rows %q, want %q", rows, want)
	}
}

// The admin route reads every tenant, or one, and groups by tenant; it
// needs the admin key.
func TestAdminUsageAcrossTenants(t *testing.T) {
	srv := usageServer(t)
	assertJSONError(t, admin(srv, "GET", "/v1/admin/usage", keyAlice, ""), 403, "forbidden")
	rec := admin(srv, "GET", "/v1/admin/usage?"+usageRange+"&group_by=tenant", "root", "")
	b := decodeUsage(t, rec.Code, rec.Body.String())
	if len(b.Rows) != 2 || b.Rows[0].Tenant != "acme" || b.Rows[0].TotalTokens != 42 || b.Rows[1].Tenant != "globex" {
		t.Fatalf("by tenant: %+v", b)
	}
	rec = admin(srv, "GET", "/v1/admin/usage?"+usageRange+"&tenant=globex&group_by=model", "root", "")
	b = decodeUsage(t, rec.Code, rec.Body.String())
	if len(b.Rows) != 1 || b.Rows[0].Group != "m2" {
		t.Fatalf("globex by model: %+v", b)
	}
	rec = admin(srv, "GET", "/v1/admin/usage?"+usageRange+"&group_by=user&format=csv", "root", "")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "globex,gus,1,1,1000,1000,0,2000") {
		t.Fatalf("admin csv by user: %d %s", rec.Code, rec.Body)
	}
}

// Without a ledger the routes say it is off.
func TestUsageOff(t *testing.T) {
	srv, _, _ := newTestServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	assertJSONError(t, as(srv, "k-acme", "GET", "/v1/usage", ""), 404, "usage_disabled")
	assertJSONError(t, admin(srv, "GET", "/v1/admin/usage", "root", ""), 404, "usage_disabled")
}
