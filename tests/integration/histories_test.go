package integration

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// recordHistory saves a finished workflow's history under tests/histories
// when SLUICE_TEST_RECORD_HISTORIES=1, for the replay test to check that
// workflow code changes stay deterministic.
func recordHistory(t *testing.T, requestID, name string) {
	t.Helper()
	if !testenv.RecordingHistories() {
		return
	}
	result(t, requestID) // wait until closed
	saveHistory(t, workflows.ChatWorkflowID(requestID), name)
}

// saveHistory writes a workflow's history so far under tests/histories.
func saveHistory(t *testing.T, workflowID, name string) {
	t.Helper()
	path, n, err := testenv.SaveHistory(context.Background(), stack.temporal, workflowID, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %s (%d events)", path, n)
}
