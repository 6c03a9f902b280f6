package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/workflows"
)

// A worker run exposes the Temporal SDK's metrics under Temporal's own
// names and tags (the ones its dashboards and guides query), and Sluice's
// tokens, queue waits, time to first token and dependency gauges.
func TestTemporalSDKMetricsOnAWorkerRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answer(t, ctx, `{"query":"What does the janitor reclaim?","max_tokens":8}`)
	// A request whose accepted event is there but whose workflow Temporal
	// does not know (as after its retention ran out): GET describes it,
	// and the failed DescribeWorkflowExecution is what
	// temporal_request_failure_total counts.
	gone := "chat-01J00000000000000000000000"
	log := events.NewLog(stack.redis, events.LogOptions{KeyPrefix: keyPrefix})
	if _, err := log.Append(ctx, gone, events.TypeAccepted, events.Accepted{RequestID: gone, Tenant: "anonymous"}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(stack.baseURL + "/v1/requests/" + gone)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET a request Temporal does not know: %d, want 404", resp.StatusCode)
	}
	families := scrapeFamilies(t)
	for _, name := range metrics.TemporalSeries {
		family := strings.TrimSuffix(name, "_bucket")
		if _, ok := families[family]; !ok {
			t.Errorf("/metrics lacks %s (metrics.TemporalSeries)", name)
		}
	}
	ns, queue := stack.cfg.Temporal.Namespace, stack.cfg.Temporal.TaskQueue
	for _, want := range []struct {
		family string
		labels map[string]string
	}{
		{"temporal_activity_execution_latency_seconds", map[string]string{
			"namespace": ns, "task_queue": queue, "workflow_type": workflows.ChatWorkflowName, "activity_type": "StreamLLM"}},
		{"temporal_activity_schedule_to_start_latency_seconds", map[string]string{
			"namespace": ns, "task_queue": queue, "workflow_type": workflows.ChatWorkflowName, "activity_type": "StreamLLM"}},
		{"temporal_workflow_task_schedule_to_start_latency_seconds", map[string]string{
			"namespace": ns, "task_queue": queue, "workflow_type": workflows.ChatWorkflowName}},
		{"temporal_num_pollers", map[string]string{"namespace": ns, "task_queue": queue, "poller_type": "workflow_task"}},
		{"temporal_worker_task_slots_available", map[string]string{"namespace": ns, "task_queue": queue, "worker_type": "WorkflowWorker"}},
		{"temporal_request_failure_total", map[string]string{"namespace": ns, "operation": "DescribeWorkflowExecution"}},
		{"sluice_llm_tokens_total", map[string]string{"pool": "short", "kind": "completion"}},
		{"sluice_admission_wait_seconds", map[string]string{"pool": "short"}},
		{"sluice_ttft_seconds", map[string]string{"pool": "short"}},
		{"sluice_pool_queue_oldest_wait_seconds", map[string]string{"pool": "short"}},
		{"sluice_dependency_up", map[string]string{"dependency": "redis"}},
		{"sluice_dependency_up", map[string]string{"dependency": "temporal"}},
	} {
		m := findMetric(families[want.family], want.labels)
		if m == nil {
			t.Errorf("/metrics has no %s with %v; it has:\n%s", want.family, want.labels, describe(families[want.family]))
			continue
		}
		if want.family == "sluice_dependency_up" && m.GetGauge().GetValue() != 1 {
			t.Errorf("%s%v = %v, want 1", want.family, want.labels, m.GetGauge().GetValue())
		}
	}
}

// scrape is the API's /metrics page, on metrics.addr.
func scrape(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(stack.metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func scrapeFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(scrape(t)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

// findMetric returns the family's first metric carrying every label of
// want (it may carry more).
func findMetric(f *dto.MetricFamily, want map[string]string) *dto.Metric {
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if got[k] != v {
				match = false
			}
		}
		if match {
			return m
		}
	}
	return nil
}

func describe(f *dto.MetricFamily) string {
	var b strings.Builder
	for i, m := range f.GetMetric() {
		if i == 5 {
			b.WriteString("  …\n")
			break
		}
		b.WriteString("  ")
		for _, l := range m.GetLabel() {
			b.WriteString(l.GetName() + "=" + l.GetValue() + " ")
		}
		b.WriteString("\n")
	}
	return b.String()
}
