package door

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/workflows"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
)

// startChat starts the request's workflow with the settings of its tier,
// after it waited at the door for waited.
func (d *Door) startChat(ctx context.Context, a arrival, req Request, waited time.Duration) error {
	cfg := d.cfg
	in := workflows.ChatInput{
		RequestID: a.id, Tenant: a.who.Tenant, User: a.who.User, KeyID: a.who.KeyID, Tier: a.who.Tier,
		Query: req.Query, KB: req.KB, KBTenant: req.kbTenant, SessionID: req.SessionID, MaxTokens: *req.MaxTokens,
		Pool: a.pool, PromptBound: d.promptBound(&req), RateReservation: a.reservation, BudgetReservation: a.budget, AdmissionTokens: a.admitTokens, AdmissionPlace: a.place, Settings: ChatSettings(d.cfg, a.tier),
		Conversation: req.Conversation, Gateway: req.Gateway, Sampling: req.Sampling, Fallback: req.fallback,
		Response: req.Response,
	}
	if req.Choices > 1 {
		in.Choices = req.Choices
	}
	// The class, not the tier, weighs the request in the fair order.
	in.ServiceTier = a.class.Name
	in.Settings.Weight, in.Settings.TTFTSLO, in.Settings.TPOTSLO = a.class.Weight, a.class.TTFTSLO, a.class.TPOTSLO
	in.Settings.RefuseLate = a.class.RefuseLate
	in.Deadline = a.deadline()
	if waited > 0 || a.class.RefuseLate || a.background {
		// The door's wait counts against the request's max wait, which
		// a class that refuses late requests bounds by its deadline.
		in.Settings.MaxWait, in.Settings.MaxWaitByPool = d.maxWait(a)-waited, nil
	}
	in.Background = a.background
	// An answer that depends on a conversation is that conversation's
	// own: requests in a session neither read nor fill the answer cache.
	in.Settings.AnswerCache = d.answerKBs[req.kbRef().Key()] && req.cacheable()
	// No workflow execution timeout: every wait inside the workflow is
	// bounded (max_wait, LLM timeouts and attempts, local activity
	// deadlines), and a timeout would cost the server a timer per request.
	opts := client.StartWorkflowOptions{
		ID:                    workflows.ChatWorkflowID(a.id),
		TaskQueue:             cfg.Temporal.TaskQueue,
		EnableEagerStart:      cfg.Temporal.EagerStart,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	}
	if cfg.Temporal.SearchAttributes {
		opts.TypedSearchAttributes = temporal.NewSearchAttributes(workflows.SearchTenant.ValueSet(a.who.Tenant))
	}
	// Not the request's context: a client that leaves mid-call must not
	// leave a started workflow we believe failed. If it left, streaming
	// notices at once and detaches.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := d.temporal.ExecuteWorkflow(sctx, opts, workflows.ChatWorkflowName, in)
	if err != nil && d.startedAnyway(a.id) {
		// The start timed out or its reply was lost, but the server
		// started it: the request runs, and its client follows it.
		d.logger.Warn("workflow start reported an error but the workflow exists; following it", "requestID", a.id, "err", err)
		return nil
	}
	return err
}

// startedAnyway resolves a start whose outcome is unknown by its id: a
// request that runs must not be told it failed (it would run for nobody,
// and its client would retry it), nor one that does not be followed.
func (d *Door) startedAnyway(id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := d.temporal.DescribeWorkflow(ctx, workflows.ChatWorkflowID(id), "")
	return err == nil
}

// open subscribes to the request's events and writes its accepted event.
// Subscribing first means the events the workflow writes while its start
// call is still returning are already buffered for the client; the
// accepted event is the stream's first entry whatever the workflow writes.
// On failure its caller gives back what the request holds, once its
// waiter has left the waiting room with its place (arrival.leave).
func (d *Door) open(ctx context.Context, a arrival, req *Request) (*events.Subscription, error) {
	sub, err := d.hub.Subscribe(ctx, a.id, "0")
	if err != nil {
		d.logger.Error("subscribe to events", "requestID", a.id, "err", err)
		return nil, refusal.Unreachable("event stream unavailable")
	}
	if _, err := d.events.Append(ctx, a.id, events.TypeAccepted, events.Accepted{RequestID: a.id, Tenant: a.who.Tenant, User: a.who.User, KB: req.KB, ServiceTier: a.class.Name}); err != nil {
		d.logger.Error("write accepted event", "requestID", a.id, "err", err)
		sub.Close()
		return nil, refusal.Unreachable("event store unavailable")
	}
	return sub, nil
}
