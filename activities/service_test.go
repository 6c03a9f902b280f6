package activities_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
)

// tenantTokens reads sluice_tenant_llm_tokens_total by
// "tenant/pool/tier/kind".
func tenantTokens(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sluice_tenant_llm_tokens_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[strings.Join([]string{labels["tenant"], labels["pool"], labels["tier"], labels["kind"]}, "/")] = mt.GetCounter().GetValue()
		}
	}
	return out
}

// failScriptOnce fails the first script call (EVALSHA or EVAL) it sees, as
// a Redis blip would.
type failScriptOnce struct{ failed atomic.Int32 }

func (f *failScriptOnce) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *failScriptOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		if (name == "evalsha" || name == "eval") && f.failed.CompareAndSwap(0, 1) {
			err := errors.New("injected: connection reset")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (f *failScriptOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A request's service counts once: Finalize's first attempt counts it
// before anything can fail, and the retry after that attempt failed on
// Redis does not count it again.
func TestFinalizeCountsTenantServiceOnceAcrossRetries(t *testing.T) {
	h := newHarness(t, nil)
	m := metrics.New(quiet)
	m.TrackTenants(10)
	h.acts.Metrics = m
	h.admit(t, "r1", "granted")
	blip := &failScriptOnce{}
	h.rdb.AddHook(blip)
	in := done("r1")
	in.Report = &activities.Report{Route: request.PoolShort, Outcome: request.OutcomeDone, Tier: "free", Tenant: "acme",
		Usage: events.Usage{PromptTokens: 120, CompletionTokens: 30, TotalTokens: 150}}

	// As the workflow runs it: a local activity with retries.
	env := (&testsuite.WorkflowTestSuite{}).NewTestWorkflowEnvironment()
	env.RegisterActivity(h.acts)
	env.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
		ctx = workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: 5 * time.Second,
			RetryPolicy:         &temporal.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 3},
		})
		return workflow.ExecuteLocalActivity(ctx, h.acts.Finalize, in).Get(ctx, nil)
	}, workflow.RegisterOptions{Name: "finalize"})
	env.ExecuteWorkflow("finalize")
	if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
		t.Fatalf("finalize: completed %v, %v", env.IsWorkflowCompleted(), env.GetWorkflowError())
	}
	if blip.failed.Load() != 1 {
		t.Fatal("the first attempt did not fail: the test proves nothing")
	}
	if last, ok, err := h.log.Last(context.Background(), "r1"); err != nil || !ok || last.Type != events.TypeDone {
		t.Fatalf("last event %+v, %v, %v: want done, written by the retry", last, ok, err)
	}
	got := tenantTokens(t, m)
	if got["acme/short/free/prompt"] != 120 || got["acme/short/free/completion"] != 30 || len(got) != 2 {
		t.Fatalf("tenant tokens %v, want acme's 120 prompt and 30 completion once", got)
	}
}

// Only service an LLM call in a pool gave counts: not a cached answer, a
// request refused before routing, or one that used no tokens.
func TestFinalizeCountsOnlyPoolService(t *testing.T) {
	h := newHarness(t, nil)
	m := metrics.New(quiet)
	m.TrackTenants(10)
	h.acts.Metrics = m
	usage := events.Usage{PromptTokens: 50, CompletionTokens: 5, TotalTokens: 55}
	for i, r := range []activities.Report{
		{Route: request.RouteCache, Outcome: request.OutcomeDone, Tenant: "acme", Tier: "vip", Usage: usage},
		{Outcome: request.OutcomeRejected, Reason: request.ReasonQueueTimeout, Tenant: "acme", Tier: "vip"},
		{Route: request.PoolLong, Outcome: request.OutcomeCancelled, Tenant: "acme", Tier: "vip"},
		{Route: request.PoolLong, Outcome: request.OutcomeDone, Tenant: "acme", Tier: "vip", Usage: usage},
	} {
		id := "r" + string(rune('0'+i))
		finalize(t, h, activities.FinalizeInput{RequestID: id, Report: &r})
	}
	got := tenantTokens(t, m)
	if got["acme/long/vip/prompt"] != 50 || got["acme/long/vip/completion"] != 5 || len(got) != 2 {
		t.Fatalf("tenant tokens %v, want only the long pool's answer", got)
	}
}
