package api

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// A request the rate limits refuse gets its log line, without its text.
func TestRateLimitedRequestIsLogged(t *testing.T) {
	var buf testenv.SyncBuffer
	srv, _, _ := newTestServerWith(t, limitedConfig, func(_ *redis.Client, o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&buf, nil))
	})
	drain := door.RatesOf(srv.policy.Current().Limits.Tiers["standard"]).Buckets(limiter.Caller{Tenant: "acme"}, 5990)
	if d, err := limiterOf(srv).Reserve(context.Background(), "other", drain); err != nil || d.Status != limiter.Allowed {
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
