package keyscli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The CLI sends what the admin API expects, with the admin key from the
// environment, and prints what it answers.
func TestCommandsCallTheAdminAPI(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer root" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"code":"unauthorized","message":"admin key required"}}`))
			return
		}
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		got = append(got, r.Method+" "+r.URL.RequestURI())
		switch {
		case r.Method == "POST" && body["tenant"] == "acme" && body["scopes"].([]any)[1] == "ingest":
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"abcdefghijkl","key":"sk_abcdefghijkl_secret","masked":"sk_abcdefghijkl_…","tenant":"acme","scopes":["chat","ingest"]}`))
		case r.Method == "GET" && r.URL.Path == "/v1/admin/keys":
			_, _ = w.Write([]byte(`{"keys":[{"id":"abcdefghijkl","masked":"sk_abcdefghijkl_…","tenant":"acme","scopes":["chat"],"created_at":"2026-12-01T10:00:00Z"}]}`))
		case r.Method == "GET" && r.URL.Path == "/v1/admin/bans":
			_, _ = w.Write([]byte(`{"bans":[{"kind":"ip","value":"203.0.113.7","since":"2026-12-01T10:00:00Z","remaining_s":42}]}`))
		case r.Method == "DELETE" && r.URL.Path == "/v1/admin/keys/nope":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"code":"bad_key_id","message":"a key id is 12 characters"}}`))
		default:
			_, _ = w.Write([]byte(`{}`))
		}
	}))
	defer srv.Close()
	env := func(k string) string {
		return map[string]string{"SLUICE_URL": srv.URL, "SLUICE_ADMIN_KEY": "root"}[k]
	}
	ctx := context.Background()
	var out bytes.Buffer
	if err := Run(ctx, "sluice keys", []string{"create", "-tenant", "acme", "-scopes", "chat,ingest", "-quiet"}, env, &out); err != nil || out.String() != "sk_abcdefghijkl_secret\n" {
		t.Fatalf("create: %q %v", out.String(), err)
	}
	for _, args := range [][]string{{"list", "-tenant", "acme"}, {"bans"}, {"revoke", "abcdefghijkl"}, {"unban", "ip", "2001:db8::"}} {
		out.Reset()
		if err := Run(ctx, "sluice keys", args, env, &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if args[0] == "list" && !strings.Contains(out.String(), "sk_abcdefghijkl_…  acme") {
			t.Fatalf("list printed %q", out.String())
		}
		if args[0] == "bans" && !strings.Contains(out.String(), "203.0.113.7") {
			t.Fatalf("bans printed %q", out.String())
		}
	}
	want := "POST /v1/admin/keys|GET /v1/admin/keys?tenant=acme|GET /v1/admin/bans|DELETE /v1/admin/keys/abcdefghijkl|DELETE /v1/admin/bans/ip/2001:db8::"
	if strings.Join(got, "|") != want {
		t.Fatalf("calls\n%s\nwant\n%s", strings.Join(got, "|"), want)
	}
	if err := Run(ctx, "sluice keys", []string{"revoke", "nope"}, env, &out); err == nil || !strings.Contains(err.Error(), "bad_key_id: a key id is 12 characters") {
		t.Fatalf("an error answer: %v", err)
	}
	var u usageError
	if err := Run(ctx, "sluice keys", []string{"create"}, env, &out); !errors.As(err, &u) {
		t.Fatalf("create without a tenant: %v", err)
	}
	noKey := func(k string) string { return map[string]string{"SLUICE_URL": srv.URL}[k] }
	if err := Run(ctx, "sluice keys", []string{"list"}, noKey, &out); !errors.As(err, &u) {
		t.Fatalf("without SLUICE_ADMIN_KEY: %v", err)
	}
}

// Help is asked with -h before or after the command, needs no admin key,
// and exits 0 with the usage on stdout; a usage error exits 2.
func TestHelpAndUsage(t *testing.T) {
	none := func(string) string { return "" }
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"create", "-h"}, {"-url", "http://x", "-h"}} {
		var out, errOut bytes.Buffer
		if code := Main(context.Background(), "sluice keys", args, none, &out, &errOut); code != 0 ||
			!strings.HasPrefix(out.String(), "usage: sluice keys [-url URL] <command>") || errOut.Len() != 0 {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), "sluice-keys", []string{"frobnicate"}, func(string) string { return "root" }, &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), `sluice-keys: unknown command "frobnicate"`) {
		t.Fatalf("unknown command: exit %d, stderr %q", code, errOut.String())
	}
}
