package usagecli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An admin key reads the admin route with the flags as parameters and
// prints a table; a tenant's key reads its own route and may not name a
// tenant; -csv prints the server's CSV as it came; -h is help.
func TestReadsTheUsageRoutes(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization")+" "+r.URL.RequestURI())
		if r.URL.Query().Get("format") == "csv" {
			_, _ = w.Write([]byte("tenant,day,requests\nacme,2026-12-01,3\n"))
			return
		}
		if r.URL.Query().Get("group_by") == "nope" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"code":"bad_group_by","message":"group_by: must be day, user, key or model"}}`))
			return
		}
		if r.URL.Path == "/v1/usage" {
			_, _ = w.Write([]byte(`{"tenant":"globex","from":"2026-12-01","to":"2026-12-08","group_by":"model","rows":[{"group":"m2","requests":1,"answered":1,"prompt_tokens":1000,"completion_tokens":1000,"total_tokens":2000}]}`))
			return
		}
		_, _ = w.Write([]byte(`{"from":"2026-12-01","to":"2026-12-08","group_by":"tenant","rows":[{"tenant":"acme","group":"acme","requests":3,"answered":2,"prompt_tokens":30,"completion_tokens":12,"total_tokens":42}]}`))
	}))
	defer srv.Close()
	env := func(vars map[string]string) func(string) string {
		return func(k string) string { return vars[k] }
	}
	admin := env(map[string]string{"SLUICE_URL": srv.URL, "SLUICE_ADMIN_KEY": "root"})
	var out bytes.Buffer
	if err := run(context.Background(), "sluice-usage", []string{"-from", "2026-12-01", "-to", "2026-12-08", "-group-by", "tenant"}, admin, &out); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 ||
		strings.Join(strings.Fields(lines[0]), " ") != "TENANT REQUESTS ANSWERED PROMPT COMPLETION CACHED TOTAL" ||
		strings.Join(strings.Fields(lines[1]), " ") != "acme 3 2 30 12 0 42" {
		t.Fatalf("table by tenant:\n%s", out.String())
	}
	out.Reset()
	if err := run(context.Background(), "sluice-usage", []string{"-csv"}, admin, &out); err != nil || !strings.HasPrefix(out.String(), "tenant,day,requests\n") {
		t.Fatalf("csv: %v\n%s", err, out.String())
	}
	tenantKey := env(map[string]string{"SLUICE_URL": srv.URL, "SLUICE_KEY": "sk_t"})
	out.Reset()
	if err := run(context.Background(), "sluice-usage", []string{"-group-by", "model"}, tenantKey, &out); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 ||
		strings.Join(strings.Fields(lines[1]), " ") != "globex m2 1 1 1000 1000 0 2000" {
		t.Fatalf("a tenant's table by model:\n%s", out.String())
	}
	var u usageError
	if err := run(context.Background(), "sluice-usage", []string{"-tenant", "other"}, tenantKey, &out); !errors.As(err, &u) {
		t.Fatalf("-tenant with a tenant key: %v", err)
	}
	if err := run(context.Background(), "sluice-usage", []string{"-group-by", "nope"}, admin, &out); err == nil || !strings.Contains(err.Error(), "bad_group_by") {
		t.Fatalf("server's refusal: %v", err)
	}
	if err := run(context.Background(), "sluice-usage", []string{"-h"}, admin, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if err := run(context.Background(), "sluice-usage", nil, env(nil), &out); !errors.As(err, &u) {
		t.Fatalf("no key: %v", err)
	}
	want := []string{
		"Bearer root /v1/admin/usage?from=2026-12-01&group_by=tenant&to=2026-12-08",
		"Bearer root /v1/admin/usage?format=csv&group_by=day",
		"Bearer sk_t /v1/usage?group_by=model",
		"Bearer root /v1/admin/usage?group_by=nope",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
