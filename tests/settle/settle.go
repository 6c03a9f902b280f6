// Package settle waits for a test stack to come to rest after a scenario:
// every permit and queue place given back, no chat workflow still
// running. The chaos, multi-instance and integration tests all end on it.
// (It is apart from testenv, which the admission package's own tests
// import and so cannot import admission or workflows itself.)
package settle

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/workflows"
)

// PoolsIdle waits up to within until no pool of gate has a permit held
// (expired ones count until reclaimed) or anyone queued, and says which
// were still busy if they did not settle.
func PoolsIdle(ctx context.Context, gate *admission.Gate, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var busy []string
		for _, pool := range gate.Pools() {
			st, err := gate.Stats(ctx, pool)
			if err != nil {
				busy = append(busy, fmt.Sprintf("pool %s: %v", pool, err))
				continue
			}
			if st.InUse != 0 || st.Waiting != 0 {
				busy = append(busy, fmt.Sprintf("pool %s: %d permits held, %d queued", pool, st.InUse, st.Waiting))
			}
		}
		if len(busy) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %s", within, strings.Join(busy, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RunningChats waits up to within for no chat workflow to be running in
// namespace and returns how many still are.
func RunningChats(ctx context.Context, tc client.Client, namespace string, within time.Duration) (int64, error) {
	deadline := time.Now().Add(within)
	q := fmt.Sprintf("WorkflowType = '%s' AND ExecutionStatus = 'Running'", workflows.ChatWorkflowName)
	for {
		resp, err := tc.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{Namespace: namespace, Query: q})
		if err != nil && time.Now().After(deadline) {
			return 0, fmt.Errorf("count running chat workflows: %w", err)
		}
		if err == nil && (resp.GetCount() == 0 || time.Now().After(deadline)) {
			return resp.GetCount(), nil
		}
		time.Sleep(250 * time.Millisecond)
	}
}
