package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/version"
)

// run is the sluice command in a test: no environment variables, its
// output captured.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }, Environ: func() []string { return nil }}
	code = Main(context.Background(), args, env)
	return code, out.String(), errOut.String()
}

// Every command answers -h with its usage on stdout and exit 0, so
// that a person can explore the command safely; a wrong command line
// exits 2 with the usage on stderr.
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"}, {"serve", "-h"}, {"keys", "-h"}, {"keys", "create", "-h"},
		{"config", "-h"}, {"config", "check", "-h"}, {"healthcheck", "-h"}, {"kb", "-h"}, {"kb", "ingest", "-h"},
	} {
		code, out, errOut := run(t, args...)
		if code != 0 || !strings.Contains(out, "usage: sluice") || errOut != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	for _, args := range [][]string{{}, {"frobnicate"}, {"serve"}, {"serve", "everything"}, {"config"}, {"config", "check"},
		{"config", "check", "a.yaml", "b.yaml"}, {"healthcheck", "-bogus"}, {"healthcheck", "extra"},
		{"kb"}, {"kb", "frobnicate"}, {"kb", "ingest"}, {"kb", "ingest", "-kb", "notes"}} {
		if code, out, errOut := run(t, args...); code != 2 || out != "" || errOut == "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and the usage on stderr", args, code, out, errOut)
		}
	}
}

// The processes' own flags (app.Run, config.FromCommandLine) answer -h
// and -version with 0 and start nothing; a flag they do not know is 2.
func TestServeFlags(t *testing.T) {
	for args, want := range map[string]int{
		"serve api -h": 0, "serve worker -help": 0, "serve all -version": 0, "serve api -bogus": 2, "serve worker extra": 2,
	} {
		if code, _, _ := run(t, strings.Fields(args)...); code != want {
			t.Errorf("%s: exit %d, want %d", args, code, want)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "-version", "--version"} {
		if code, out, _ := run(t, arg); code != 0 || out != version.Line("sluice")+"\n" {
			t.Errorf("%s: exit %d, %q", arg, code, out)
		}
	}
}

// config check is start-up's validation: the example config passes; a
// bad one fails with every problem, each naming its field.
func TestConfigCheck(t *testing.T) {
	example := filepath.Join("..", "..", "..", "deploy", "sluice.example.yaml")
	if code, out, errOut := run(t, "config", "check", example); code != 0 || out != example+": ok\n" {
		t.Fatalf("example config: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("api:\n  max_body_bytes: -1\nadmission:\n  max_wait: -1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "config", "check", bad)
	if code != 1 || out != "" || !strings.Contains(errOut, "api.max_body_bytes") || !strings.Contains(errOut, "admission.max_wait") {
		t.Fatalf("bad config: exit %d, stdout %q, stderr %q; want 1 naming both fields", code, out, errOut)
	}
	unknown := filepath.Join(t.TempDir(), "unknown.yaml")
	if err := os.WriteFile(unknown, []byte("api:\n  no_such_field: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "config", "check", unknown); code != 1 || !strings.Contains(errOut, "no_such_field") {
		t.Fatalf("unknown field: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := run(t, "config", "check", filepath.Join(t.TempDir(), "missing.yaml")); code != 1 || errOut == "" {
		t.Fatalf("missing file: exit %d, stderr %q", code, errOut)
	}
}

// healthcheck exits 0 on a 2xx answer and 1 on anything else.
func TestHealthcheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	if code, _, errOut := run(t, "healthcheck", "-url", srv.URL+"/healthz"); code != 0 || errOut != "" {
		t.Fatalf("healthy: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := run(t, "healthcheck", "-url", srv.URL+"/readyz"); code != 1 || !strings.Contains(errOut, "503") {
		t.Fatalf("503: exit %d, stderr %q", code, errOut)
	}
	srv.Close()
	if code, _, errOut := run(t, "healthcheck", "-url", srv.URL+"/healthz", "-timeout", "1s"); code != 1 || errOut == "" {
		t.Fatalf("nothing listening: exit %d, stderr %q", code, errOut)
	}
}

// Under an alias's name (a link to sluice in the image) the binary is
// that command: each answers -h with 0, as its single-purpose binary does;
// under any other name it is sluice.
func TestAliases(t *testing.T) {
	for name := range Aliases {
		var out, errOut bytes.Buffer
		env := Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }, Environ: func() []string { return nil }}
		if code := MainAs(context.Background(), name, []string{"-h"}, env); code != 0 {
			t.Errorf("%s -h: exit %d, stderr %q", name, code, errOut.String())
		}
	}
	var out bytes.Buffer
	env := Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }, Environ: func() []string { return nil }}
	if code := MainAs(context.Background(), "sluice-api", []string{"-bogus"}, env); code != 2 {
		t.Errorf("sluice-api -bogus: exit %d, want 2", code)
	}
	out.Reset()
	if code := MainAs(context.Background(), "sluice.exe", []string{"-h"}, env); code != 0 || !strings.Contains(out.String(), "usage: sluice <command>") {
		t.Errorf("another name is sluice: exit %d, %q", code, out.String())
	}
}
