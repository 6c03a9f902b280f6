package kbcli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// api is the real API process the tests ingest through: on a real Redis
// and a real Temporal dev server, as `sluice serve api` runs it.
var api struct{ url string }

// The keys of the test API: one with the ingest scope, one without.
const (
	keyIngest = "sk-kbcli-ingest"
	keyChat   = "sk-kbcli-chat"
	// maxDocuments is the API's ingest.max_documents: small, so that a
	// -batch above it is split.
	maxDocuments = 3
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("kbcli tests need a Temporal dev server: skipped in -short mode")
		os.Exit(0)
	}
	code, err := start(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kbcli test setup:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func start(m *testing.M) (int, error) {
	ctx := context.Background()
	rds, err := testenv.LaunchRedis()
	if err != nil {
		return 0, err
	}
	defer rds.Stop()
	ts, err := testenv.LaunchTemporal(ctx, workflows.SearchAttributeNames)
	if err != nil {
		return 0, err
	}
	defer func() { _ = ts.Stop() }()
	cfg := config.Default()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.API.EmbeddedWorker = false
	cfg.Temporal.HostPort = ts.FrontendHostPort()
	cfg.Redis.Addr = rds.Addr
	cfg.Redis.KeyPrefix = "kbcli:"
	cfg.Healing.Enabled = false
	cfg.Auth.AllowAnonymous = false
	cfg.Ingest.MaxDocuments = maxDocuments
	cfg.Auth.APIKeys = []config.APIKey{
		{Key: keyIngest, Tenant: "acme", User: "alice", Scopes: []string{"chat", "ingest"}},
		{Key: keyChat, Tenant: "acme", User: "bob", Scopes: []string{"chat"}},
	}
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	a, err := app.StartAPI(wctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	cancel()
	if err != nil {
		return 0, err
	}
	api.url = a.URL
	code := m.Run()
	if err := a.Stop(20 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code, nil
}

// result is what one run of the command did.
type result struct {
	code           int
	stdout, stderr string
}

// runIngest runs `sluice kb ingest args` with key against the test API, its
// progress as lines; onStderr, if set, sees each write to stderr.
func runIngest(t *testing.T, ctx context.Context, key string, onStderr func(string), args ...string) result {
	t.Helper()
	var out bytes.Buffer
	errOut := &watched{on: onStderr}
	env := Env{Stdout: &out, Stderr: errOut, Progress: "lines", Getenv: func(k string) string {
		return map[string]string{"SLUICE_URL": api.url, "SLUICE_KEY": key}[k]
	}}
	code := Main(ctx, "sluice kb", append([]string{"ingest"}, args...), env)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// watched is a buffer that shows each write to a callback.
type watched struct {
	mu  sync.Mutex
	buf bytes.Buffer
	on  func(string)
}

func (w *watched) Write(p []byte) (int, error) {
	w.mu.Lock()
	n, _ := w.buf.Write(p)
	w.mu.Unlock()
	if w.on != nil {
		w.on(string(p))
	}
	return n, nil
}

func (w *watched) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// writeFiles makes files (path → content) under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// kbDoc is a document as GET /v1/kb/:kb describes it.
type kbDoc struct {
	ID, Title, Rev string
	Metadata       map[string]string
}

// documents is what the API says kb holds, through key.
func documents(t *testing.T, key, kb string) []kbDoc {
	t.Helper()
	var page struct{ Documents []kbDoc }
	callAPI(t, key, http.MethodGet, "/v1/kb/"+kb+"?limit=200", http.StatusOK, &page)
	return page.Documents
}

func callAPI(t *testing.T, key, method, path string, want int, dst any) {
	t.Helper()
	req, err := http.NewRequest(method, api.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, raw, want)
	}
	if dst != nil {
		if err := json.Unmarshal(raw, dst); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

func ids(docs []kbDoc) []string {
	out := make([]string, len(docs))
	for i, d := range docs {
		out[i] = d.ID
	}
	return out
}

// A folder goes in as documents named by their paths; a run stopped
// after its first batch leaves the state of that batch, and the next run
// sends only the rest; a run over an unchanged folder sends nothing; a
// changed file, and a document deleted from the kb behind the state's
// back, are sent again.
func TestIngestResumesWhereItStopped(t *testing.T) {
	dir, state := t.TempDir(), filepath.Join(t.TempDir(), "state.json")
	writeFiles(t, dir, map[string]string{
		"alpha.md":         "# Alpha\n\nAlpha is the first letter of the Greek alphabet.",
		"guides/beta.md":   "Beta comes second.",
		"guides/gamma.txt": "Gamma is third.",
		"delta.markdown":   "# Delta\n\nDelta is the fourth.",
		"epsilon.md":       "Epsilon is fifth.",
		"zeta.txt":         "Zeta is sixth.",
		".drafts/eta.md":   "A hidden folder is left out.",
		"picture.png":      "not an extension that is taken",
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopAfterFirstBatch := func(s string) {
		if strings.HasPrefix(s, "batch 1:") {
			cancel()
		}
	}
	r := runIngest(t, ctx, keyIngest, stopAfterFirstBatch, "-kb", "resume", "-batch", "2", "-state", state, dir)
	if r.code != 1 || !strings.Contains(r.stderr, "interrupted with 2 of 6 files done; run the same command again") {
		t.Fatalf("interrupted run: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if got := ids(documents(t, keyIngest, "resume")); !slices.Equal(got, []string{"alpha", "delta"}) {
		t.Fatalf("after the interrupted run the kb holds %v", got)
	}

	r = runIngest(t, context.Background(), keyIngest, nil, "-state", state, "-batch", "2", dir, "-kb", "resume")
	if r.code != 0 || !strings.Contains(r.stdout, "kb resume: 6 files: 4 sent (4 changed, 0 unchanged), 2 already in the kb") {
		t.Fatalf("resumed run: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	docs := documents(t, keyIngest, "resume")
	if got := ids(docs); !slices.Equal(got, []string{"alpha", "delta", "epsilon", "guides/beta", "guides/gamma", "zeta"}) {
		t.Fatalf("the kb holds %v", got)
	}
	if docs[0].Title != "Alpha" || docs[3].Metadata["source"] != "guides/beta.md" {
		t.Fatalf("title or source not as sent: %+v", docs)
	}

	r = runIngest(t, context.Background(), keyIngest, nil, "-kb", "resume", "-state", state, dir)
	if r.code != 0 || !strings.Contains(r.stdout, "6 files: 0 sent (0 changed, 0 unchanged), 6 already in the kb") || r.stderr != "" {
		t.Fatalf("run over an unchanged folder: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}

	writeFiles(t, dir, map[string]string{"epsilon.md": "Epsilon is fifth, and now it says more."})
	callAPI(t, keyIngest, http.MethodDelete, "/v1/kb/resume/documents/zeta", http.StatusOK, nil)
	r = runIngest(t, context.Background(), keyIngest, nil, "-kb", "resume", "-state", state, dir)
	if r.code != 0 || !strings.Contains(r.stdout, "6 files: 2 sent (2 changed, 0 unchanged), 4 already in the kb") {
		t.Fatalf("run after a change: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	// Without the state, everything is sent and the kb says nothing changed.
	r = runIngest(t, context.Background(), keyIngest, nil, "-kb", "resume", "-state", "", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "6 files: 6 sent (0 changed, 6 unchanged), 0 already in the kb") {
		t.Fatalf("run without state: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}

// A batch over the server's ingest.max_documents is split, and the run
// goes on at the size that fits; a FILE named alone is its own name.
func TestTooLargeBatchIsSplit(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{}
	for i := range 7 {
		files[fmt.Sprintf("doc%d.md", i)] = fmt.Sprintf("Document number %d of seven.", i)
	}
	writeFiles(t, dir, files)
	r := runIngest(t, context.Background(), keyIngest, nil, "-kb", "split", "-batch", "8", "-state", "",
		filepath.Join(dir, "doc0.md"), filepath.Join(dir, "doc1.md"), filepath.Join(dir, "doc2.md"),
		filepath.Join(dir, "doc3.md"), filepath.Join(dir, "doc4.md"), filepath.Join(dir, "doc5.md"), filepath.Join(dir, "doc6.md"))
	if r.code != 0 || !strings.Contains(r.stderr, "too_many_documents") || !strings.Contains(r.stdout, "7 files: 7 sent (7 changed") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if got := ids(documents(t, keyIngest, "split")); len(got) != 7 || got[0] != "doc0" {
		t.Fatalf("the kb holds %v", got)
	}
}

// Refusals are surfaced with the API's status, code and message and exit
// 1; files that cannot be documents are named and left out while the
// rest go in; a command line that is wrong exits 2.
func TestRefusalsAreSurfaced(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"ok.md": "A fine document.", "empty.md": " \n", "at@sign.md": "An id may not hold @."})
	state := filepath.Join(t.TempDir(), "state.json")

	r := runIngest(t, context.Background(), keyChat, nil, "-kb", "refused", "-state", state, dir)
	if r.code != 1 || !strings.Contains(r.stderr, "POST /v1/kb/refused/documents: 403 missing_scope:") {
		t.Fatalf("a key without the ingest scope: exit %d\nstderr: %s", r.code, r.stderr)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Fatalf("a refused run wrote its state: %v", err)
	}
	r = runIngest(t, context.Background(), keyIngest, nil, "-kb", "bad name", "-state", state, dir)
	if r.code != 1 || !strings.Contains(r.stderr, "400 bad_kb:") {
		t.Fatalf("a bad kb name: exit %d\nstderr: %s", r.code, r.stderr)
	}
	r = runIngest(t, context.Background(), "sk-nobody", nil, "-kb", "refused", "-state", state, dir)
	if r.code != 1 || !strings.Contains(r.stderr, "401") {
		t.Fatalf("an unknown key: exit %d\nstderr: %s", r.code, r.stderr)
	}

	r = runIngest(t, context.Background(), keyIngest, nil, "-kb", "partly", "-state", state, dir)
	if r.code != 1 || !strings.Contains(r.stdout, "3 files: 1 sent (1 changed") ||
		!strings.Contains(r.stderr, "empty.md: document empty has no text") ||
		!strings.Contains(r.stderr, "at@sign.md: id \"at@sign\" may not contain") ||
		!strings.Contains(r.stderr, "2 files could not be documents") {
		t.Fatalf("files that cannot be documents: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if got := ids(documents(t, keyIngest, "partly")); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("the kb holds %v", got)
	}

	writeFiles(t, dir, map[string]string{"twice.md": "one", "twice.txt": "two"})
	r = runIngest(t, context.Background(), keyIngest, nil, "-kb", "twice", "-state", state, dir)
	if r.code != 1 || !strings.Contains(r.stderr, `would both be document "twice"`) {
		t.Fatalf("two files of one id: exit %d\nstderr: %s", r.code, r.stderr)
	}
	callAPI(t, keyIngest, http.MethodGet, "/v1/kb/twice", http.StatusNotFound, nil)

	for _, args := range [][]string{{}, {"-kb", "x"}, {dir}, {"-kb", "x", "-batch", "0", dir}, {"-bogus"}} {
		if r := runIngest(t, context.Background(), keyIngest, nil, args...); r.code != 2 || !strings.Contains(r.stderr, "usage: sluice kb ingest") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and the usage", args, r.code, r.stderr)
		}
	}
	if r := runIngest(t, context.Background(), keyIngest, nil, "-h"); r.code != 0 || !strings.Contains(r.stdout, "-batch-bytes") {
		t.Errorf("-h: exit %d, stdout %q", r.code, r.stdout)
	}
}

// Only regular files are documents: a device named on the command line
// (/dev/zero, once read forever) is an error before anything is read or
// sent, and a folder's pipes and links to devices are passed over.
func TestOnlyRegularFilesAreRead(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero here")
	}
	if _, err := collect([]string{"/dev/zero"}, []string{".md"}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("collect(/dev/zero) = %v, want it refused as not a regular file", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.md"), []byte("# A\n\nAlpha."), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "zero.md")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.md"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := collect([]string{dir}, []string{".md"})
	if err != nil || len(got) != 1 || got[0].id != "a" {
		t.Fatalf("collect(dir) = %+v %v, want a.md alone", got, err)
	}
	// A file that grew past a document's bound after it was listed is
	// read no further than the bound.
	big := filepath.Join(dir, "big.md")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), ingest.MaxTextBytes+10), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readAtMost(big, ingest.MaxTextBytes); err == nil {
		t.Fatal("a file over the bound was read")
	}
}
