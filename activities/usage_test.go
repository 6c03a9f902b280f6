package activities_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// failingLedger refuses every write, as a ledger that is down does.
type failingLedger struct{ usage.Store }

func (failingLedger) Record(context.Context, usage.Entry) (bool, error) {
	return false, errors.New("connection refused")
}

// RecordUsage writes a request once: the retry after an attempt that
// wrote and lost its reply finds it and adds nothing; a broken stream
// that consumed tokens is billed to its pool's model; every write is
// counted by its result, a refused one too (and returned, for the
// workflow to retry).
func TestRecordUsageWritesOnce(t *testing.T) {
	ledger, err := usage.OpenSQLite(context.Background(), usage.SQLiteOptions{Path: filepath.Join(t.TempDir(), "usage.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	m := metrics.New(quiet)
	acts := &activities.Chat{Usage: ledger, Metrics: m, Logger: quiet,
		Pools: map[string]activities.Pool{"short": {Model: "sim-small"}}}
	at := time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)
	in := activities.RecordUsageInput{Entry: usage.Entry{RequestID: "chat-1", Tenant: "acme", User: "alice", Pool: "short", Route: "short",
		PromptTokens: 30, CompletionTokens: 4, Outcome: "failed", Reason: "stream_interrupted", FinishedAt: at}}
	for range 2 {
		if err := acts.RecordUsage(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := ledger.Query(context.Background(), usage.Query{Tenant: "acme", From: at, To: at.AddDate(0, 0, 1), GroupBy: usage.GroupModel})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Group != "sim-small" || rows[0].Requests != 1 || rows[0].TotalTokens != 34 {
		t.Fatalf("rows %+v, want one request of sim-small with 34 tokens", rows)
	}
	acts.Usage = failingLedger{}
	if err := acts.RecordUsage(context.Background(), in); err == nil || !strings.Contains(err.Error(), "chat-1") {
		t.Fatalf("a refused write: %v", err)
	}
	got := map[string]float64{}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "sluice_usage_records_total" {
			for _, mt := range f.GetMetric() {
				got[mt.GetLabel()[0].GetValue()] = mt.GetCounter().GetValue()
			}
		}
	}
	if got["inserted"] != 1 || got["duplicate"] != 1 || got["failed"] != 1 {
		t.Fatalf("sluice_usage_records_total %v", got)
	}
}

// A worker with the ledger off records nothing and does not fail.
func TestRecordUsageWithTheLedgerOff(t *testing.T) {
	acts := &activities.Chat{Logger: quiet}
	if err := acts.RecordUsage(context.Background(), activities.RecordUsageInput{Entry: usage.Entry{RequestID: "chat-1"}}); err != nil {
		t.Fatal(err)
	}
}
