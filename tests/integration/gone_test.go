package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// A request whose workflow an operator terminates, or that the server no
// longer has (a dev server restarted in memory), ends its stream with an
// error event within seconds instead of sending keep-alives forever.
func TestStreamEndsWhenItsWorkflowIsGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove func(ctx context.Context, id string) error
		says   string
	}{
		{"terminated", func(ctx context.Context, id string) error {
			return stack.temporal.TerminateWorkflow(ctx, id, "", "an operator ended it")
		}, "terminated"},
		{"vanished", func(ctx context.Context, id string) error {
			_, err := stack.temporal.WorkflowService().DeleteWorkflowExecution(ctx, &workflowservice.DeleteWorkflowExecutionRequest{
				Namespace: stack.cfg.Temporal.Namespace, WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: id},
			})
			return err
		}, "lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holdShortPool(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s := open(t, ctx, http.MethodPost, "/v1/chat", `{"query":"Where did my request go?","max_tokens":8}`,
				map[string]string{"Authorization": "Bearer k-burst"})
			defer s.close()
			s.until(t, func(ev testenv.SSEEvent) bool { return ev.Event == events.TypeQueue })
			start := time.Now()
			if err := tc.remove(ctx, s.id); err != nil {
				t.Fatal(err)
			}
			evs := s.until(t, terminal)
			last := evs[len(evs)-1]
			var f events.Failure
			if err := json.Unmarshal([]byte(last.Data), &f); err != nil || last.Event != events.TypeError || !strings.Contains(f.Message, tc.says) {
				t.Fatalf("ended with %+v, want an error saying the request %s", last, tc.says)
			}
			// Two liveness rounds and visibility's delay, with room for a
			// loaded machine; before, it took the 2 min stream idle timeout
			// (and a vanished workflow never ended).
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("the stream ended %v after its workflow was gone", took)
			}
			// The place its workflow can no longer give back was given back.
			if _, queued, err := stack.gate.Position(ctx, request.PoolShort, s.id); err != nil || queued {
				t.Fatalf("still queued (%v, %v) after its workflow was gone", queued, err)
			}
		})
	}
}
