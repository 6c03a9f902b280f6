package workflows

import (
	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/request"
	"go.temporal.io/sdk/workflow"
)

// watchCancel turns the cancel signal, workflow cancellation and a client
// detached beyond the grace period into cancellation of the stages. A
// background request has no client to lose: its readers come and go
// (the signals are still taken off their channels) and only a cancel
// ends it.
func (w *chat) watchCancel(ctx workflow.Context) {
	cancelCh := workflow.GetSignalChannel(ctx, SignalCancel)
	detachCh := workflow.GetSignalChannel(ctx, SignalDetach)
	attachCh := workflow.GetSignalChannel(ctx, SignalAttach)
	attached := 1
	var grace workflow.Future
	var stopGrace workflow.CancelFunc
	for w.cancelReason == "" {
		if attached <= 0 && grace == nil {
			if w.in.Settings.DisconnectGrace <= 0 {
				w.requestCancel(ctx, "client_disconnected")
				return
			}
			var gctx workflow.Context
			gctx, stopGrace = workflow.WithCancel(ctx)
			grace = workflow.NewTimer(gctx, w.in.Settings.DisconnectGrace)
		}
		if attached > 0 && grace != nil {
			stopGrace()
			grace = nil
		}
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(cancelCh, func(c workflow.ReceiveChannel, _ bool) {
			var s CancelSignal
			c.Receive(ctx, &s)
			reason := s.Reason
			if reason == "" {
				reason = "cancel_signal"
			}
			w.requestCancel(ctx, reason)
		})
		sel.AddReceive(detachCh, func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(ctx, nil)
			if !w.in.Background {
				attached--
			}
		})
		sel.AddReceive(attachCh, func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(ctx, nil)
			if !w.in.Background {
				attached++
			}
		})
		sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) {
			w.requestCancel(ctx, "workflow_cancelled")
		})
		if grace != nil {
			sel.AddFuture(grace, func(f workflow.Future) {
				if f.Get(ctx, nil) == nil {
					w.requestCancel(ctx, "client_disconnected")
				}
			})
		}
		sel.Select(ctx)
	}
}

func (w *chat) requestCancel(ctx workflow.Context, reason string) {
	if w.cancelReason != "" || w.status.Stage == request.StageFinished {
		return
	}
	w.cancelReason = reason
	w.status.CancelRequested = true
	w.logger.Info("cancel requested", "reason", reason, "stage", w.status.Stage)
	w.cancelStages()
	if w.llmRunning {
		// Activity cancellation reaches a running activity only with its
		// next heartbeat; the stop flag ends the stream within one token.
		dctx, _ := workflow.NewDisconnectedContext(ctx)
		f := workflow.ExecuteLocalActivity(localCtx(dctx), a.StopStream, activities.StopStreamInput{RequestID: w.in.RequestID})
		if err := f.Get(dctx, nil); err != nil {
			w.logger.Warn("raise stop flag", "error", err)
		}
	}
}
