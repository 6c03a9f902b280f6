// Package versioned is a fixture for tests/replay's GetVersion check: a
// workflow package with branches of each kind it must find.
package versioned

import (
	wf "go.temporal.io/sdk/workflow"
)

const byConstant = "by-constant"

func Workflow(ctx wf.Context) error {
	if wf.GetVersion(ctx, "literal-change", wf.DefaultVersion, 1) == 1 {
		_ = wf.Sleep(ctx, 1)
	}
	_ = wf.GetVersion(ctx, byConstant, wf.DefaultVersion, 2)
	_ = wf.GetVersionWithOptions(ctx, "with-options", wf.DefaultVersion, 1, wf.GetVersionOptions{})
	return nil
}
