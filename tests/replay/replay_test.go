// Package replay replays recorded workflow histories against the current
// workflow code, so that a change that would break running workflows
// (non-determinism) fails CI. Histories are recorded from real runs by
// `SLUICE_TEST_RECORD_HISTORIES=1 go test ./tests/integration/` (and, for
// a request that lost Redis, the chaos suite's redis-down scenario).
package replay

import (
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// Histories recorded with codec.enabled (under encrypted/, sealed with
// testenv.CodecTestKeyID) replay through the same codec; without it, they
// do not, so the codec is what makes them readable.
func TestReplayEncryptedHistories(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "tests", "histories", "encrypted", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no recorded histories under tests/histories/encrypted")
	}
	ring, err := codec.NewKeyring(testenv.CodecTestKeyID, codec.Key{ID: testenv.CodecTestKeyID, Secret: testenv.CodecTestKeySecret})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			var opts worker.WorkflowReplayerOptions
			ring.ApplyReplayer(&opts)
			r, err := worker.NewWorkflowReplayerWithOptions(opts)
			if err != nil {
				t.Fatal(err)
			}
			register(r)
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatalf("replay %s: %v", filepath.Base(f), err)
			}
			plain := worker.NewWorkflowReplayer()
			register(plain)
			// Quiet: its failure is expected, and would log a panic.
			if err := plain.ReplayWorkflowHistoryFromJSONFile(testenv.QuietLogger{}, f); err == nil {
				t.Fatalf("%s replays without the codec: it is not encrypted", filepath.Base(f))
			}
		})
	}
}

func register(r worker.WorkflowReplayer) {
	r.RegisterWorkflowWithOptions(workflows.ChatWorkflow, workflow.RegisterOptions{Name: workflows.ChatWorkflowName})
	r.RegisterWorkflowWithOptions(workflows.HealingWorkflow, workflow.RegisterOptions{Name: workflows.HealingWorkflowName})
}

func TestReplayRecordedHistories(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "tests", "histories", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no recorded histories under tests/histories")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflowWithOptions(workflows.ChatWorkflow, workflow.RegisterOptions{Name: workflows.ChatWorkflowName})
			r.RegisterWorkflowWithOptions(workflows.HealingWorkflow, workflow.RegisterOptions{Name: workflows.HealingWorkflowName})
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatalf("replay %s: %v", filepath.Base(f), err)
			}
		})
	}
}
