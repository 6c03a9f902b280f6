package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/temporalproto"
	"go.temporal.io/sdk/client"
)

// RecordingHistories reports whether SLUICE_TEST_RECORD_HISTORIES=1 asks
// the suites to save the histories tests/replay replays. Re-record only
// on purpose: a history that no longer replays means running workflows
// would break.
func RecordingHistories() bool { return os.Getenv("SLUICE_TEST_RECORD_HISTORIES") == "1" }

// SaveHistory writes a workflow's history so far to
// tests/histories/<name>.json and returns the path and its event count.
func SaveHistory(ctx context.Context, tc client.Client, workflowID, name string) (string, int, error) {
	it := tc.GetWorkflowHistory(ctx, workflowID, "", false, 0)
	hist := &historypb.History{}
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return "", 0, fmt.Errorf("read history of %s: %w", workflowID, err)
		}
		hist.Events = append(hist.Events, ev)
	}
	raw, err := temporalproto.CustomJSONMarshalOptions{Indent: "  "}.Marshal(hist)
	if err != nil {
		return "", 0, fmt.Errorf("encode history of %s: %w", workflowID, err)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", 0, err
	}
	path := filepath.Join(root, "tests", "histories", name+".json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", 0, err
	}
	if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		return "", 0, err
	}
	return path, len(hist.Events), nil
}
