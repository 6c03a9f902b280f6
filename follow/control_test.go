package follow

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/workflows"
)

// written3 writes an accepted event, a token and, if done, the done
// event; it returns their ids.
func (r *rig) written3(t *testing.T, id string, done bool) []string {
	t.Helper()
	ids := []string{
		r.append(t, id, events.TypeAccepted, events.Accepted{RequestID: id}),
		r.append(t, id, events.TypeToken, events.Token{Text: "w"}),
	}
	if done {
		ids = append(ids, r.append(t, id, events.TypeDone, events.Done{RequestID: id}))
	}
	return ids
}

// next reads what sub has, within a few seconds, as the event types.
func next(t *testing.T, sub *events.Subscription, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var types []string
	for len(types) < n {
		evs, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", types, err)
		}
		for _, ev := range evs {
			types = append(types, ev.Type)
		}
	}
	return types
}

// signalled is the names of the signals sent to id's workflow.
func (r *rig) signalled(id string) []string {
	var names []string
	for _, s := range r.temporal.sent() {
		if s.workflowID == workflows.ChatWorkflowID(id) {
			names = append(names, s.name)
		}
	}
	return names
}

// unavailable reports whether err is the refusal of a store or stream
// that cannot serve, with msg.
func unavailable(err error, msg string) bool {
	var re *refusal.Error
	return errors.As(err, &re) && re.Class == refusal.Unavailable && re.Message == msg
}

// Resume follows the events after the client's last one and tells the
// workflow a reader is back; a client that has the terminal event is
// told so, and nobody is signalled.
func TestResume(t *testing.T) {
	for _, tc := range []struct {
		name string
		done bool
		// after picks the client's last event from the written ones ("0-0"
		// when it returns -1).
		after    int
		want     []string
		sentBack error
	}{
		{name: "from the start", done: true, after: -1, want: []string{"accepted", "token", "done"}},
		{name: "mid-answer", done: true, after: 0, want: []string{"token", "done"}},
		{name: "running", after: 0, want: []string{"token"}},
		{name: "past the end", done: true, after: 2, sentBack: ErrAlreadySent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			r.temporal.answer(notFound)
			ids := r.written3(t, "r", tc.done)
			after := "0-0"
			if tc.after >= 0 {
				after = ids[tc.after]
			}
			sub, err := r.Resume(context.Background(), "r", after)
			if tc.sentBack != nil {
				if !errors.Is(err, tc.sentBack) || sub != nil {
					t.Fatalf("Resume = %v, %v; want %v", sub, err, tc.sentBack)
				}
				if got := r.signalled("r"); len(got) != 0 {
					t.Fatalf("signalled %v for a client that has it all", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			if got := next(t, sub, len(tc.want)); !slices.Equal(got, tc.want) {
				t.Fatalf("resumed with %v, want %v", got, tc.want)
			}
			if got := r.signalled("r"); !slices.Equal(got, []string{workflows.SignalAttach}) {
				t.Fatalf("signalled %v, want attach", got)
			}
		})
	}
}

// Attach follows a request that exists from its first event, or after
// the event named; one whose events are gone is ErrStreamGone.
func TestAttach(t *testing.T) {
	for _, tc := range []struct {
		name string
		// written: the request's events exist.
		written bool
		// after is the event the client names: "" none, "first" the
		// first written, or a string that is no event id.
		after string
		want  []string
		err   error
	}{
		{name: "from the start", written: true, want: []string{"accepted", "token", "done"}},
		{name: "after an event", written: true, after: "first", want: []string{"token", "done"}},
		{name: "after no event id", written: true, after: "not-an-id", want: []string{"accepted", "token", "done"}},
		{name: "events gone", err: ErrStreamGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			after := tc.after
			if tc.written {
				ids := r.written3(t, "r", true)
				if after == "first" {
					after = ids[0]
				}
			}
			sub, err := r.Attach(context.Background(), "r", after)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || sub != nil {
					t.Fatalf("Attach = %v, %v; want %v", sub, err, tc.err)
				}
				if got := r.signalled("r"); len(got) != 0 {
					t.Fatalf("signalled %v for a request without events", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			if got := next(t, sub, len(tc.want)); !slices.Equal(got, tc.want) {
				t.Fatalf("attached with %v, want %v", got, tc.want)
			}
			if got := r.signalled("r"); !slices.Equal(got, []string{workflows.SignalAttach}) {
				t.Fatalf("signalled %v, want attach", got)
			}
		})
	}
}

// An event store or stream that cannot serve refuses Resume and Attach as
// unavailable; a workflow that cannot be told a reader is back is logged.
func TestResumeAndAttachWhenSomethingFails(t *testing.T) {
	t.Run("event store", func(t *testing.T) {
		r := newRig(t, nil)
		r.events = events.NewLog(closedClient(), events.LogOptions{KeyPrefix: r.prefix})
		if _, err := r.Resume(context.Background(), "r", "0-0"); !unavailable(err, "event store unavailable") {
			t.Errorf("Resume: %v, want the event store unavailable", err)
		}
		if _, err := r.Attach(context.Background(), "r", ""); !unavailable(err, "event store unavailable") {
			t.Errorf("Attach: %v, want the event store unavailable", err)
		}
	})
	t.Run("event stream", func(t *testing.T) {
		r := newRig(t, nil)
		r.written3(t, "r", false)
		r.stopHub()
		if _, err := r.Resume(context.Background(), "r", "0-0"); !unavailable(err, "event stream unavailable") {
			t.Errorf("Resume: %v, want the event stream unavailable", err)
		}
		if _, err := r.Attach(context.Background(), "r", ""); !unavailable(err, "event stream unavailable") {
			t.Errorf("Attach: %v, want the event stream unavailable", err)
		}
	})
	t.Run("workflow service", func(t *testing.T) {
		r := newRig(t, nil)
		r.written3(t, "r", false)
		r.temporal.answer(errors.New("connection refused"))
		sub, err := r.Attach(context.Background(), "r", "")
		if err != nil {
			t.Fatalf("Attach with the workflow service down: %v", err)
		}
		sub.Close()
		if !strings.Contains(r.logs.String(), "signal attach") {
			t.Fatalf("the failed signal was not logged: %s", r.logs)
		}
	})
}

// Detach tells the workflow its reader left, unless the process is
// draining (its clients resume elsewhere); DetachNow tells it always. A
// workflow that is gone needs no telling, and is not logged.
func TestDetach(t *testing.T) {
	for _, tc := range []struct {
		name     string
		draining bool
		now      bool
		answer   error
		want     []string
		logged   bool
	}{
		{name: "detach", want: []string{workflows.SignalDetach}},
		{name: "detach while draining", draining: true},
		{name: "detach now", now: true, want: []string{workflows.SignalDetach}},
		{name: "detach now while draining", draining: true, now: true, want: []string{workflows.SignalDetach}},
		{name: "workflow gone", answer: notFound, want: []string{workflows.SignalDetach}},
		{name: "workflow service down", answer: errors.New("connection refused"), want: []string{workflows.SignalDetach}, logged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			r.temporal.answer(tc.answer)
			if tc.draining {
				r.Drain()
			}
			if r.Draining() != tc.draining {
				t.Fatalf("Draining() = %v, want %v", r.Draining(), tc.draining)
			}
			if tc.now {
				r.DetachNow("r")
			} else {
				r.Detach("r")
			}
			if got := r.signalled("r"); !slices.Equal(got, tc.want) {
				t.Fatalf("signalled %v, want %v", got, tc.want)
			}
			if logged := strings.Contains(r.logs.String(), "signal detach"); logged != tc.logged {
				t.Fatalf("logged %v, want %v: %s", logged, tc.logged, r.logs)
			}
		})
	}
}

// Cancel signals the request's workflow; a request without one (yet) has
// its stop flag raised for the door it waits at, unless it already
// finished, which is a Conflict.
func TestCancel(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer error
		// written: its events before the cancel; done, with its end.
		written, done bool
		// brokenStore: the event store cannot serve.
		brokenStore bool
		stopped     bool
		class       refusal.Class
		code        string
	}{
		{name: "running", written: true},
		{name: "at the door", answer: notFound, written: true, stopped: true},
		{name: "finished", answer: notFound, written: true, done: true, class: refusal.Conflict, code: "already_finished"},
		{name: "events gone", answer: notFound, class: refusal.Conflict, code: "already_finished"},
		{name: "workflow service down", answer: errors.New("connection refused"), written: true, class: refusal.Unavailable},
		{name: "event store down", answer: notFound, written: true, brokenStore: true, class: refusal.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			ctx := context.Background()
			r.temporal.answer(tc.answer)
			if tc.written {
				r.written3(t, "r", tc.done)
			}
			log := r.events
			if tc.brokenStore {
				r.events = events.NewLog(closedClient(), events.LogOptions{KeyPrefix: r.prefix})
			}
			err := r.Cancel(ctx, "r")
			var re *refusal.Error
			switch {
			case tc.class == refusal.Internal && err != nil:
				t.Fatalf("Cancel: %v", err)
			case tc.class != refusal.Internal && (!errors.As(err, &re) || re.Class != tc.class || (tc.code != "" && re.Code != tc.code)):
				t.Fatalf("Cancel: %v, want a refusal of class %v %s", err, tc.class, tc.code)
			}
			sent := r.temporal.sent()
			if len(sent) != 1 || sent[0].name != workflows.SignalCancel || sent[0].workflowID != workflows.ChatWorkflowID("r") ||
				sent[0].arg != (workflows.CancelSignal{Reason: "client_request"}) {
				t.Fatalf("signals %+v, want one cancel for the client", sent)
			}
			if stopped, err := log.Stopped(ctx, "r"); err != nil || stopped != tc.stopped {
				t.Fatalf("stop flag raised %v (%v), want %v", stopped, err, tc.stopped)
			}
		})
	}
}

// A queue event a reader wrote just after the request's end (its poll
// read the position before the end was written; events.AppendFinal looks
// past such strays) does not hide the end: a client that has the end is
// told so, and a cancel is a Conflict.
func TestAStrayQueueEventAfterTheEnd(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	r.temporal.answer(notFound)
	done := r.written3(t, "r", true)[2]
	r.append(t, "r", events.TypeQueue, events.Queue{Position: 1, Pool: pool})
	sub, err := r.Resume(ctx, "r", done)
	if !errors.Is(err, ErrAlreadySent) {
		if sub != nil {
			sub.Close()
		}
		t.Errorf("Resume after the end: %v, want ErrAlreadySent", err)
	}
	var re *refusal.Error
	if err := r.Cancel(ctx, "r"); !errors.As(err, &re) || re.Code != "already_finished" {
		t.Errorf("Cancel after the end: %v, want already_finished", err)
	}
	if stopped, _ := r.events.Stopped(ctx, "r"); stopped {
		t.Error("the stop flag of a finished request was raised")
	}
}
