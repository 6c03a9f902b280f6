package door

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/logsample"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// The first refusal of a tenant and reason is logged at once; the next
// ones within the window are counted onto the line after it.
func TestRefusalLogOneLinePerTenantAndReasonAWindow(t *testing.T) {
	var buf bytes.Buffer
	d := &Door{logger: slog.New(slog.NewJSONHandler(&buf, nil)), refusals: logsample.New()}
	now := time.Unix(1000, 0)
	d.refusals.Now = func() time.Time { return now }
	refuse := func(tenant, reason string) {
		d.logRefusal(context.Background(), arrival{id: "r", who: Caller{Tenant: tenant}}, reason)
	}
	for range 4 {
		refuse("acme", request.ReasonRateLimited)
	}
	refuse("globex", request.ReasonRateLimited)
	refuse("acme", request.ReasonQueueFull)
	now = now.Add(logsample.Every)
	refuse("acme", request.ReasonRateLimited)

	lines := testenv.FinishedLines(buf.String())
	want := []struct {
		tenant, reason string
		similar        float64
	}{
		{"acme", request.ReasonRateLimited, 0},
		{"globex", request.ReasonRateLimited, 0},
		{"acme", request.ReasonQueueFull, 0},
		{"acme", request.ReasonRateLimited, 3},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d: %s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		got := lines[i]
		similar, _ := got["similar_since_last"].(float64)
		if got["tenant"] != w.tenant || got["reason"] != w.reason || similar != w.similar || got["outcome"] != request.OutcomeRejected {
			t.Errorf("line %d: %v, want tenant %s reason %s similar_since_last %v", i, got, w.tenant, w.reason, w.similar)
		}
	}
}
