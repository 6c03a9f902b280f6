package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/temporalproto"

	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// recordHistory saves a finished workflow's history under tests/histories
// when SLUICE_TEST_RECORD_HISTORIES=1, for the replay test to check that
// workflow code changes stay deterministic. Re-record only on purpose: a
// history that no longer replays means running workflows would break.
func recordHistory(t *testing.T, requestID, name string) {
	t.Helper()
	if os.Getenv("SLUICE_TEST_RECORD_HISTORIES") != "1" {
		return
	}
	result(t, requestID) // wait until closed
	saveHistory(t, workflows.ChatWorkflowID(requestID), name)
}

// saveHistory writes a workflow's history so far under tests/histories.
func saveHistory(t *testing.T, workflowID, name string) {
	t.Helper()
	ctx := context.Background()
	it := stack.temporal.GetWorkflowHistory(ctx, workflowID, "", false, 0)
	hist := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatalf("read history of %s: %v", workflowID, err)
		}
		hist.Events = append(hist.Events, ev)
	}
	raw, err := temporalproto.CustomJSONMarshalOptions{Indent: "  "}.Marshal(hist)
	if err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "tests", "histories", name+".json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %s (%d events)", path, len(hist.Events))
}
