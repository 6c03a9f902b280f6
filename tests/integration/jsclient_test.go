package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/settle"
)

// jsClientDir holds the npm client's pinned version (package.json and
// its lock); its node_modules is installed by the test and ignored by git.
const jsClientDir = "js"

// TestOfficialJSClient runs the official npm openai client, unchanged,
// against the stack: listing models, gateway and RAG completions, a
// streamed tool call and its answer, embeddings, the Responses API
// (plain, streamed, a tool call and its output) and typed errors (see
// js/openai.test.mjs).
func TestOfficialJSClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node and npm are needed for the official JavaScript client's test: `make test` installs them (apt-get install nodejs npm)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	installJSClient(ctx, t)
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "openai.test.mjs")
	cmd.Dir = jsClientDir
	cmd.Env = append(os.Environ(),
		"SLUICE_BASE_URL="+stack.baseURL+"/v1",
		"SLUICE_KEY=k-acme",
		"SLUICE_MODEL="+stack.cfg.Pools.Short.Model,
		"SLUICE_KB="+stack.cfg.Retrieval.DefaultKB,
		"SLUICE_EMBED="+stack.cfg.Embedding.Model,
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the npm client's tests failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	// A client has its answer before its workflow ends and releases.
	if err := settle.PoolsIdle(ctx, stack.gate, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// installJSClient installs the locked npm client unless it is there.
func installJSClient(ctx context.Context, t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(jsClientDir, "node_modules", "openai", "package.json")); err == nil {
		return
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("npm is needed to install the official JavaScript client: `make test` installs it (apt-get install npm)")
	}
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = jsClientDir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
}
