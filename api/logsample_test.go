package api

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// The first refusal of a tenant and reason is logged at once; the next
// ones within the window are counted onto the line after it.
func TestRefusalLogOneLinePerTenantAndReasonAWindow(t *testing.T) {
	var buf bytes.Buffer
	s := &Server{logger: slog.New(slog.NewJSONHandler(&buf, nil)), refusals: newLogSampler()}
	now := time.Unix(1000, 0)
	s.refusals.now = func() time.Time { return now }
	refuse := func(tenant, reason string) {
		s.logRefusal(context.Background(), door{id: "r", who: caller{Tenant: tenant}}, reason)
	}
	for range 4 {
		refuse("acme", request.ReasonRateLimited)
	}
	refuse("globex", request.ReasonRateLimited)
	refuse("acme", request.ReasonQueueFull)
	now = now.Add(logEvery)
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

// A request the rate limits refuse gets its log line, without its text.
func TestRateLimitedRequestIsLogged(t *testing.T) {
	srv, _, _ := newTestServer(t, limitedConfig)
	var buf bytes.Buffer
	srv.logger = slog.New(slog.NewJSONHandler(&buf, nil))
	drain := ratesOf(srv.cfg.Limits.Tiers["standard"]).Buckets(limiter.Caller{Tenant: "acme"}, 5990)
	if d, err := srv.limiter.Reserve(context.Background(), "other", drain); err != nil || d.Status != limiter.Allowed {
		t.Fatalf("drain: %+v %v", d, err)
	}
	rec := post(srv, `{"query":"a secret question","max_tokens":64}`)
	assertJSONError(t, rec, 429, request.ReasonRateLimited)
	lines := testenv.FinishedLines(buf.String())
	if len(lines) != 1 || lines[0]["tenant"] != "acme" || lines[0]["reason"] != request.ReasonRateLimited || lines[0]["route"] != request.PoolShort {
		t.Fatalf("log %s: want one line for acme's rate_limited short request", buf.String())
	}
	if strings.Contains(buf.String(), "secret") || strings.Contains(buf.String(), "k-acme") {
		t.Fatalf("the line holds the request's text or key: %s", buf.String())
	}
}
