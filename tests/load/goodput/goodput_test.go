package goodput

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
)

// recordedHistory reads a chat history recorded from a real run. They are
// tests/histories' recordings of 2026-11-29, pinned here: those are
// re-recorded whenever the workflow changes, and the counters' expected
// figures below are these histories'.
func recordedHistory(t *testing.T, name string) []*historypb.HistoryEvent {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := client.HistoryFromJSON(f, client.HistoryJSONOptions{})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return h.GetEvents()
}

func TestCountHistoryOfRecordedChats(t *testing.T) {
	for _, tc := range []struct {
		file string
		want histCounts
	}{
		// Admitted at once: start, 4 local activities in the first task
		// (one action), the LLM activity, 1 local activity in the second
		// task, the search attribute upsert.
		{"chat_done.json", histCounts{events: 17, workflowTasks: 2, activities: 1, actions: 5}},
		// Queued, then admitted by the releaser's signal: its re-check
		// timer, the signal and the task it wakes on come on top.
		{"chat_admitted_by_signal.json", histCounts{events: 23, workflowTasks: 3, timers: 1, signals: 1, activities: 1, actions: 8, admitted: true}},
		// Queued until max_wait: four re-checks, each a timer and a task
		// with a local activity, and no LLM call.
		{"chat_queue_timeout.json", histCounts{events: 33, workflowTasks: 5, timers: 4, actions: 11}},
	} {
		if got := countHistory(recordedHistory(t, tc.file)); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.file, got, tc.want)
		}
	}
}

// ev builds a history event of a type; attrs sets its attributes.
func ev(id int64, typ enums.EventType, attrs func(*historypb.HistoryEvent)) *historypb.HistoryEvent {
	e := &historypb.HistoryEvent{EventId: id, EventType: typ}
	if attrs != nil {
		attrs(e)
	}
	return e
}

func marker(name string) func(*historypb.HistoryEvent) {
	return func(e *historypb.HistoryEvent) {
		e.Attributes = &historypb.HistoryEvent_MarkerRecordedEventAttributes{MarkerRecordedEventAttributes: &historypb.MarkerRecordedEventAttributes{MarkerName: name}}
	}
}

func TestActionsAsCloudBillsThem(t *testing.T) {
	la := marker(markerLocalActivity)
	evs := []*historypb.HistoryEvent{
		ev(1, enums.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, nil),           // 1
		ev(2, enums.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, nil),              //
		ev(3, enums.EVENT_TYPE_MARKER_RECORDED, la),                       // 1 for the task's
		ev(4, enums.EVENT_TYPE_MARKER_RECORDED, la),                       //   local activities
		ev(5, enums.EVENT_TYPE_MARKER_RECORDED, marker(markerSideEffect)), // 1
		ev(6, enums.EVENT_TYPE_MARKER_RECORDED, marker("Version")),        // 0
		ev(7, enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, nil),              // 1
		ev(8, enums.EVENT_TYPE_ACTIVITY_TASK_STARTED, func(e *historypb.HistoryEvent) { // 2 retries
			e.Attributes = &historypb.HistoryEvent_ActivityTaskStartedEventAttributes{ActivityTaskStartedEventAttributes: &historypb.ActivityTaskStartedEventAttributes{Attempt: 3}}
		}),
		ev(9, enums.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, nil),                       //
		ev(10, enums.EVENT_TYPE_MARKER_RECORDED, la),                               // 1: another task
		ev(11, enums.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED, nil),     // 2
		ev(12, enums.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, nil),                  // 1
		ev(13, enums.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES, nil),            // 1
		ev(14, enums.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, nil),                 // 0
		ev(15, enums.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, nil),           // 1
		ev(16, enums.EVENT_TYPE_TIMER_STARTED, nil),                                // 1
		ev(17, enums.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, nil),                      // 0
		ev(18, enums.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED, nil), // 0: counted where received
	}
	if got, want := actionsOf(evs), 1+1+1+1+2+1+2+1+1+1+1; got != want {
		t.Fatalf("actions: got %d, want %d", got, want)
	}
}

func TestAdmittedSignalMarksAWait(t *testing.T) {
	signal := func(name string) *historypb.HistoryEvent {
		return ev(2, enums.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, func(e *historypb.HistoryEvent) {
			e.Attributes = &historypb.HistoryEvent_WorkflowExecutionSignaledEventAttributes{WorkflowExecutionSignaledEventAttributes: &historypb.WorkflowExecutionSignaledEventAttributes{SignalName: name, Input: &commonpb.Payloads{}}}
		})
	}
	if c := countHistory([]*historypb.HistoryEvent{signal("detach")}); c.admitted || c.signals != 1 {
		t.Fatalf("detach signal: %+v", c)
	}
	if c := countHistory([]*historypb.HistoryEvent{signal("admitted")}); !c.admitted {
		t.Fatalf("admitted signal: %+v", c)
	}
}

// fakeStep is a closed-loop step of a 10 s window with the given
// requests.
func fakeStep(system string, mult float64, reqs ...attempt) *goodputStep {
	return &goodputStep{loop: loopClosed, mult: mult, system: system, clients: int(16 * mult), window: 10 * time.Second, reqs: reqs}
}

func doneIn(ttft time.Duration, id string) attempt {
	return attempt{Result: chat.Result{Kind: chat.KindDone, TTFT: ttft, ID: id}}
}

// An answer counts within the SLO when its first token and its pace met
// the tier's bounds; answer times are the done requests' own.
func TestGoodputWithinSLO(t *testing.T) {
	slo := slo.Tiers[slo.Interactive]
	answer := func(ttft, last, took time.Duration) attempt {
		return attempt{Result: chat.Result{Kind: chat.KindDone, TTFT: ttft, Last: last, Tokens: 11}, took: took}
	}
	s := fakeStep(sysSluice, 1,
		answer(200*time.Millisecond, 700*time.Millisecond, 800*time.Millisecond),   // 50 ms a token: met
		answer(1500*time.Millisecond, 2*time.Second, 2100*time.Millisecond),        // first token late
		answer(100*time.Millisecond, 2100*time.Millisecond, 2200*time.Millisecond), // 200 ms a token: slow
		attempt{Result: chat.Result{Kind: "rejected queue_timeout"}, took: time.Second},
	)
	if got := s.goodputIn(slo); got != 0.1 {
		t.Errorf("goodput within SLO %v/s, want 0.1/s (one answer in 10 s)", got)
	}
	if a := s.answerTimes(); len(a) != 3 || a.At(50) != 2100*time.Millisecond || a.At(100) != 2200*time.Millisecond {
		t.Errorf("answer times %v: want the three answers' own", a)
	}
}

func TestGoodputStepFigures(t *testing.T) {
	var reqs []attempt
	for i := 1; i <= 100; i++ {
		reqs = append(reqs, doneIn(time.Duration(i)*time.Millisecond, "w"))
	}
	reqs = append(reqs,
		attempt{Result: chat.Result{Kind: "rejected queue_timeout", ID: "w"}},
		attempt{Result: chat.Result{Kind: chat.KindHang, ID: "w"}},
		attempt{Result: chat.Result{Kind: "HTTP 503 busy"}},
		attempt{Result: chat.Result{Kind: "HTTP 500 internal_error"}},
	)
	s := fakeStep(sysSluice, 1, reqs...)
	s.cpu = windowCPU{temporal: 5, others: 2}
	s.hist.once.add(histCounts{workflowTasks: 2})
	s.hist.queued.add(histCounts{workflowTasks: 4})
	if s.done() != 100 || s.goodput() != 10 {
		t.Fatalf("done %d, goodput %v: want 100, 10/s", s.done(), s.goodput())
	}
	if l := s.ttft(); l.At(50) != 50*time.Millisecond || l.At(99) != 99*time.Millisecond || l.At(100) != 100*time.Millisecond {
		t.Fatalf("TTFT p50 %v p99 %v max %v", l.At(50), l.At(99), l.At(100))
	}
	if got := report.OutcomeLine(s.outcomes()); got != "HTTP 500 internal_error 1, HTTP 503 busy 1, client timeout 1, done 100, rejected queue_timeout 1" {
		t.Fatalf("outcomes: %s", got)
	}
	// 102 workflows at 3 tasks each, over 100 answers.
	if got := s.wftPerDone(); got != 3.06 {
		t.Fatalf("workflow tasks per done: %v", got)
	}
	if got := s.perDone(s.cpu.temporal); got != 0.05 {
		t.Fatalf("CPU per done: %v", got)
	}
	header, row := csvHeader(), csvRow(s, slo.Tiers[slo.Interactive])
	if len(row) != len(header) {
		t.Fatalf("csv row has %d cells, header %d", len(row), len(header))
	}
	cell := func(col string) string {
		for i, h := range header {
			if h == col {
				return row[i]
			}
		}
		t.Fatalf("no column %s", col)
		return ""
	}
	for col, want := range map[string]string{"done": "100", "rejected_queue_timeout": "1", "rejected_other": "0", "http_503_busy": "1", "http_other": "1", "client_timeouts": "1", "ttft_p99_ms": "99.0", "goodput_in_slo_per_s": "10.000", "other_processes_cores": "0.200", "workflow_tasks_at_once": "2.000", "workflow_tasks_queued": "4.000", "arrivals_per_s": ""} {
		if got := cell(col); got != want {
			t.Errorf("csv %s: got %s, want %s", col, got, want)
		}
	}
}

func TestGoodputGoals(t *testing.T) {
	n := func(k int) []attempt {
		out := make([]attempt, k)
		for i := range out {
			out[i] = doneIn(time.Millisecond, "w")
		}
		return out
	}
	once, queued := histCounts{workflowTasks: 2, actions: 5}, histCounts{workflowTasks: 3, timers: 1, signals: 1, actions: 8}
	one := fakeStep(sysSluice, 1, n(170)...)
	one.hist.once.add(once)
	one.hist.queued.add(queued)
	steps := []*goodputStep{one, fakeStep(sysBare, 1, n(200)...), fakeStep(sysSluice, 2, n(160)...), fakeStep(sysSluice, 8, n(100)...)}
	got := goodputGoals(steps, []float64{0.5, 1, 2, 8})
	var verdicts []bool
	for _, g := range got {
		verdicts = append(verdicts, g.Met)
	}
	// 0.85× the bare workflow: met; 2×: 0.94×, met; 8×: 0.59×, missed;
	// queueing: +1 signal, +1 timer, +1 task, met.
	if len(got) != 4 || !verdicts[0] || !verdicts[1] || verdicts[2] || !verdicts[3] {
		t.Fatalf("goals %v", got)
	}
	if !strings.Contains(got[3].Measured, "+1.000 signals, +1.000 timers, +1.000 workflow tasks (+3.00 actions") {
		t.Fatalf("queueing goal: %s", got[3].Measured)
	}
	// The step where queueing costs most is judged: three re-check timers
	// at 2× are two too many.
	steps[2].hist.queued.add(histCounts{workflowTasks: 5, timers: 3, signals: 1})
	if g := goodputGoals(steps, nil); g[len(g)-1].Met || !strings.HasPrefix(g[len(g)-1].Measured, "closed 2× (32 clients) sluice: +1.000 signals, +3.000 timers, +3.000 workflow tasks") {
		t.Fatalf("queueing goal: %s", g[len(g)-1].Measured)
	}
}

func TestSpread(t *testing.T) {
	xs := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	if got := spread(xs, 4); len(got) != 4 || got[0] != 0 || got[1] != 2 || got[2] != 5 || got[3] != 7 {
		t.Fatalf("spread: %v", got)
	}
	if got := spread(xs, 20); len(got) != 10 {
		t.Fatalf("spread of fewer: %v", got)
	}
}

// The open loop sheds arrivals beyond its in-flight cap, and keeps only
// the requests that ended within the window.
func TestOpenLoopShedsBeyondTheCap(t *testing.T) {
	var calls atomic.Int64
	slow := func(ctx context.Context, _ int) chat.Result {
		calls.Add(1)
		select {
		case <-ctx.Done():
		case <-time.After(150 * time.Millisecond):
		}
		return chat.Result{Kind: chat.KindDone}
	}
	run := newStepRun("test", 0, 400*time.Millisecond, time.Second)
	run.openLoop(context.Background(), 200, 2, 1, slow)
	if run.shed == 0 || run.arrivals <= run.shed || int(calls.Load()) != run.arrivals-run.shed {
		t.Fatalf("arrivals %d, shed %d, sent %d", run.arrivals, run.shed, calls.Load())
	}
	// At most 2 at a time, 150 ms each, over 400 ms: the requests that
	// ended in the window are few, and the last ones ended after it.
	if len(run.ended) == 0 || len(run.ended) > 6 || int(calls.Load()) == len(run.ended) {
		t.Fatalf("%d ended in the window of %d sent", len(run.ended), calls.Load())
	}
}

func TestClosedLoopKeepsItsClients(t *testing.T) {
	var inFlight, most atomic.Int64
	do := func(ctx context.Context, _ int) chat.Result {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(10 * time.Millisecond)
		inFlight.Add(-1)
		return chat.Result{Kind: chat.KindDone}
	}
	run := newStepRun("test", 50*time.Millisecond, 200*time.Millisecond, time.Second)
	run.closedLoop(context.Background(), 3, do)
	if most.Load() != 3 || len(run.ended) < 30 || run.done.Load() != int64(len(run.ended)) {
		t.Fatalf("most in flight %d, ended in window %d, done %d", most.Load(), len(run.ended), run.done.Load())
	}
}
