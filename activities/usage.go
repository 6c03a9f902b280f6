package activities

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/usage"
)

// RecordUsageInput is a finished request as the usage ledger keeps it.
type RecordUsageInput struct {
	Entry usage.Entry
}

// Usage results, as sluice_usage_records_total labels them.
const (
	usageInserted  = "inserted"
	usageDuplicate = "duplicate"
	usageFailed    = "failed"
)

// RecordUsage writes the request to the usage ledger. It is idempotent by
// request id, so the workflow retries it until the ledger takes it: an
// attempt that wrote and lost only its reply (a worker killed in
// between) makes the retry find the record and add nothing.
func (a *Chat) RecordUsage(ctx context.Context, in RecordUsageInput) error {
	if a.Usage == nil {
		// This worker runs with usage.store off while the door that
		// started the request has it on; nothing to write to.
		a.logger(in.Entry.RequestID).Warn("usage ledger off on this worker; request not recorded")
		return nil
	}
	e := in.Entry
	if e.Model == "" && e.Pool != "" && e.PromptTokens+e.CompletionTokens > 0 {
		// A stream that broke before its backend named the model used
		// the pool's.
		e.Model = a.Pools[e.Pool].Model
	}
	inserted, err := a.Usage.Record(ctx, e)
	switch {
	case err != nil:
		a.Metrics.UsageRecorded(usageFailed)
		return fmt.Errorf("record usage of %s: %w", e.RequestID, err)
	case inserted:
		a.Metrics.UsageRecorded(usageInserted)
	default:
		a.Metrics.UsageRecorded(usageDuplicate)
	}
	return nil
}
