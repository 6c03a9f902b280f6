package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

var (
	srv *testenv.Redis
	// rigs numbers the rigs a test process builds, so that each gets keys
	// of its own, also under -count=N.
	rigs atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

const (
	namespace = "ns"
	pool      = "p"
)

// fakeTemporal describes the workflows it was told of (others are not
// found) and lists the pages of closed workflows it was given.
type fakeTemporal struct {
	client.Client

	mu sync.Mutex
	// status is each workflow's; a workflow not in it is not found.
	status map[string]enums.WorkflowExecutionStatus
	// unreachable fails every describe.
	unreachable bool
	described   []string
	// pages answer ListWorkflow by its page token ("" first); listErr
	// fails it.
	pages   map[string]*workflowservice.ListWorkflowExecutionsResponse
	listErr error
	lists   []*workflowservice.ListWorkflowExecutionsRequest
}

func (f *fakeTemporal) DescribeWorkflow(_ context.Context, workflowID, _ string) (*client.WorkflowExecutionDescription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.described = append(f.described, workflowID)
	if f.unreachable {
		return nil, errors.New("connection refused")
	}
	st, ok := f.status[workflowID]
	if !ok {
		return nil, serviceerror.NewNotFound("workflow not found")
	}
	return &client.WorkflowExecutionDescription{WorkflowExecutionMetadata: client.WorkflowExecutionMetadata{Status: st}}, nil
}

func (f *fakeTemporal) ListWorkflow(_ context.Context, req *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists = append(f.lists, req)
	if f.listErr != nil {
		return nil, f.listErr
	}
	if page := f.pages[string(req.GetNextPageToken())]; page != nil {
		return page, nil
	}
	return &workflowservice.ListWorkflowExecutionsResponse{}, nil
}

func (f *fakeTemporal) set(id string, st enums.WorkflowExecutionStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status[workflows.ChatWorkflowID(id)] = st
}

// describedIDs are the requests described so far, sorted.
func (f *fakeTemporal) describedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]string, 0, len(f.described))
	for _, w := range f.described {
		ids = append(ids, workflows.RequestIDOf(w))
	}
	slices.Sort(ids)
	return ids
}

func (f *fakeTemporal) listed() []*workflowservice.ListWorkflowExecutionsRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.lists)
}

// notifier wakes every waiter.
type notifier struct{}

func (notifier) NotifyGranted(context.Context, string, string) (bool, error) { return false, nil }

// rig is a Sweeper over a fake Temporal, with a real event log and gate.
type rig struct {
	*Sweeper
	temporal *fakeTemporal
	log      *events.Log
	gate     *admission.Gate
	logs     *testenv.SyncBuffer
}

func newRig(t *testing.T) *rig {
	t.Helper()
	rdb := srv.Client(t)
	prefix := fmt.Sprintf("%s%d:", testenv.KeyPrefix(t), rigs.Add(1))
	gate, err := admission.New(rdb, admission.Options{
		KeyPrefix: prefix, Lease: time.Minute, WaiterTTL: time.Minute, MaxQueueDepth: 100, Limits: map[string]int{pool: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	log := events.NewLog(rdb, events.LogOptions{KeyPrefix: prefix, TTL: time.Minute})
	tc := &fakeTemporal{status: map[string]enums.WorkflowExecutionStatus{}}
	buf := &testenv.SyncBuffer{}
	l := New(tc, namespace, log, &holdings.Returner{Gate: gate, Notifier: notifier{}}, slog.New(slog.NewTextHandler(buf, nil)))
	return &rig{Sweeper: l, temporal: tc, log: log, gate: gate, logs: buf}
}

// started makes id a followed request whose workflow started, asking for
// the pool's permit (the first one holds it, the next ones queue).
func (r *rig) started(t *testing.T, id string) {
	t.Helper()
	if _, err := r.gate.Enqueue(context.Background(), pool, admission.Request{ID: id, Tenant: id, Weight: 1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Follow(id))
	r.Started(id)
}

// ended returns the error event that ended id's stream, if one did.
func (r *rig) ended(t *testing.T, id string) (events.Failure, bool) {
	t.Helper()
	last, ok, err := r.log.Last(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || last.Type != events.TypeError {
		return events.Failure{}, false
	}
	var f events.Failure
	if err := json.Unmarshal(last.Data, &f); err != nil {
		t.Fatal(err)
	}
	return f, true
}

// inPool is how many requests hold a permit and wait in the pool.
func (r *rig) inPool(t *testing.T) (held, waiting int) {
	t.Helper()
	st, err := r.gate.Stats(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return st.InUse, st.Waiting
}

// A started request whose workflow is gone — not found, or closed other
// than by completing — gets an error event saying why, and what it held
// in the pool back; one whose workflow runs, completed or continued is
// left alone.
func TestGoneRequestsEndAndGiveBack(t *testing.T) {
	const notFound enums.WorkflowExecutionStatus = -1
	for _, tc := range []struct {
		status enums.WorkflowExecutionStatus
		// why is in the message of the error event of a gone request;
		// "" for one left alone.
		why string
	}{
		{notFound, "was lost by the workflow service"},
		{enums.WORKFLOW_EXECUTION_STATUS_TERMINATED, "was terminated by an operator"},
		{enums.WORKFLOW_EXECUTION_STATUS_TIMED_OUT, "ran out of time"},
		{enums.WORKFLOW_EXECUTION_STATUS_FAILED, "failed"},
		{enums.WORKFLOW_EXECUTION_STATUS_CANCELED, "was cancelled"},
		{enums.WORKFLOW_EXECUTION_STATUS_RUNNING, ""},
		{enums.WORKFLOW_EXECUTION_STATUS_COMPLETED, ""},
		{enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW, ""},
	} {
		name := "not found"
		if tc.status != notFound {
			name = tc.status.String()
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			for _, id := range []string{"holder", "queued"} {
				if tc.status != notFound {
					r.temporal.set(id, tc.status)
				}
				r.started(t, id)
			}
			r.check(context.Background())

			for _, id := range []string{"holder", "queued"} {
				f, ended := r.ended(t, id)
				switch {
				case tc.why == "" && ended:
					t.Errorf("%s, whose workflow is %s, was ended: %+v", id, name, f)
				case tc.why == "":
				case !ended:
					t.Errorf("%s, whose workflow is %s, was not ended", id, name)
				case f.Reason != request.ReasonInternal || f.RetryAfterS != 1 ||
					f.Message != "The request "+tc.why+" before it could answer. Please retry.":
					t.Errorf("%s ended with %+v, want an internal failure saying it %s", id, f, tc.why)
				}
			}
			held, waiting := r.inPool(t)
			if gone := tc.why != ""; gone && (held != 0 || waiting != 0) {
				t.Errorf("after the gone requests ended, %d hold a permit and %d wait; want none", held, waiting)
			} else if !gone && (held != 1 || waiting != 1) {
				t.Errorf("live requests: %d hold a permit and %d wait; want 1 and 1", held, waiting)
			}
		})
	}
}

// A request seen only at the door (followed, its workflow not known to
// have started) is not probed: the door ends it. With nothing started, a
// round asks Temporal nothing.
func TestRequestsNotStartedAreNotProbed(t *testing.T) {
	r := newRig(t)
	defer r.Follow("at-the-door")()
	r.check(context.Background())
	if got := r.temporal.describedIDs(); len(got) != 0 {
		t.Fatalf("described %v, want nothing", got)
	}
	if got := r.temporal.listed(); len(got) != 0 {
		t.Fatalf("searched %d times, want none", len(got))
	}
	if _, ended := r.ended(t, "at-the-door"); ended {
		t.Fatal("a request at the door was ended")
	}
	if r.closedSince.IsZero() {
		t.Fatal("an idle round did not move the next search's start to now")
	}
}

// Each round probes one started request, in turn; a probe that finds its
// workflow gone describes every started request (the server may have lost
// them all) and ends those that are gone.
func TestAProbeThatFindsOneGoneSweepsAll(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.temporal.set("a", enums.WORKFLOW_EXECUTION_STATUS_RUNNING)
	for _, id := range []string{"a", "b", "c"} {
		r.started(t, id)
	}
	r.check(ctx)
	if got := r.temporal.describedIDs(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("first round described %v, want a alone", got)
	}
	for _, id := range []string{"b", "c"} {
		if _, ended := r.ended(t, id); ended {
			t.Fatalf("%s ended before its turn", id)
		}
	}
	r.check(ctx)
	// b's turn: gone, so a, b and c are all described.
	if got := r.temporal.describedIDs(); !slices.Equal(got, []string{"a", "a", "b", "b", "c"}) {
		t.Fatalf("described %v, want a, then b and a sweep of a, b and c", got)
	}
	for id, want := range map[string]bool{"a": false, "b": true, "c": true} {
		if _, ended := r.ended(t, id); ended != want {
			t.Errorf("%s ended %v, want %v", id, ended, want)
		}
	}
}

// The probe's turn wraps around: after the newest request, the oldest.
func TestProbeTurnsWrapAround(t *testing.T) {
	r := newRig(t)
	for _, id := range []string{"a", "b"} {
		r.temporal.set(id, enums.WORKFLOW_EXECUTION_STATUS_RUNNING)
		r.started(t, id)
	}
	defer r.Follow("door")() // not started: never its turn
	var turns []string
	for range 5 {
		id, ok := r.nextTurn()
		if !ok {
			t.Fatal("no turn with two started requests")
		}
		turns = append(turns, id)
	}
	if want := []string{"a", "b", "a", "b", "a"}; !slices.Equal(turns, want) {
		t.Fatalf("turns %v, want %v", turns, want)
	}
}

// A search finds the followed requests whose workflow closed abnormally,
// page after page, and ends each with what closed it; requests not
// followed here are not touched, and the next search starts from this one.
func TestEndClosedReadsEveryPage(t *testing.T) {
	r := newRig(t)
	exec := func(id string, st enums.WorkflowExecutionStatus) *workflowpb.WorkflowExecutionInfo {
		return &workflowpb.WorkflowExecutionInfo{Execution: &commonpb.WorkflowExecution{WorkflowId: workflows.ChatWorkflowID(id)}, Status: st}
	}
	r.temporal.pages = map[string]*workflowservice.ListWorkflowExecutionsResponse{
		"": {Executions: []*workflowpb.WorkflowExecutionInfo{
			exec("x", enums.WORKFLOW_EXECUTION_STATUS_TERMINATED), exec("elsewhere", enums.WORKFLOW_EXECUTION_STATUS_FAILED),
		}, NextPageToken: []byte("2")},
		"2": {Executions: []*workflowpb.WorkflowExecutionInfo{exec("y", enums.WORKFLOW_EXECUTION_STATUS_TIMED_OUT)}},
	}
	for _, id := range []string{"x", "y", "z"} {
		// Running as far as a describe can tell: only the search ends them.
		r.temporal.set(id, enums.WORKFLOW_EXECUTION_STATUS_RUNNING)
		r.started(t, id)
	}
	start := time.Now()
	r.check(context.Background())

	for id, why := range map[string]string{"x": "was terminated by an operator", "y": "ran out of time", "z": "", "elsewhere": ""} {
		f, ended := r.ended(t, id)
		if ended != (why != "") || !strings.Contains(f.Message, why) {
			t.Errorf("%s: ended %v with %q, want it ended %v saying %q", id, ended, f.Message, why != "", why)
		}
	}
	lists := r.temporal.listed()
	if len(lists) != 2 || len(lists[0].GetNextPageToken()) != 0 || string(lists[1].GetNextPageToken()) != "2" {
		t.Fatalf("searched %d pages %v, want the first and then page 2", len(lists), lists)
	}
	q := lists[0].GetQuery()
	if lists[0].GetNamespace() != namespace || !strings.Contains(q, "WorkflowType = '"+workflows.ChatWorkflowName+"'") ||
		!strings.Contains(q, "ExecutionStatus IN ('Terminated', 'TimedOut', 'Failed', 'Canceled')") {
		t.Fatalf("search in %q for %q", lists[0].GetNamespace(), q)
	}
	if r.closedSince.Before(start) {
		t.Fatalf("the next search starts at %v, before this one (%v)", r.closedSince, start)
	}
}

// A search that fails is logged; the round still probes, and the next
// search reaches back to where the failed one started.
func TestAFailedSearchStillProbes(t *testing.T) {
	r := newRig(t)
	r.temporal.listErr = errors.New("visibility unavailable")
	r.started(t, "gone")
	r.closedSince = time.Now().Add(-time.Minute)
	since := r.closedSince
	r.check(context.Background())
	if !strings.Contains(r.logs.String(), "search for chat workflows that closed without an end") {
		t.Fatalf("the failed search was not logged: %s", r.logs)
	}
	if _, ended := r.ended(t, "gone"); !ended {
		t.Fatal("the probe did not end the gone request")
	}
	if !r.closedSince.Equal(since) {
		t.Fatalf("a failed search moved the next one's start from %v to %v", since, r.closedSince)
	}
}

// A workflow service that cannot be reached says nothing of a workflow:
// nothing is ended.
func TestUnreachableTemporalEndsNothing(t *testing.T) {
	r := newRig(t)
	r.temporal.unreachable = true
	r.started(t, "a")
	r.check(context.Background())
	if gone, _ := r.Describe(context.Background(), "a"); gone {
		t.Fatal("Describe with the server unreachable said gone")
	}
	if _, ended := r.ended(t, "a"); ended {
		t.Fatal("a request was ended while Temporal was unreachable")
	}
	if held, _ := r.inPool(t); held != 1 {
		t.Fatalf("%d permits held, want a's kept", held)
	}
}

// A request whose stream already ended keeps its end; what it held is
// given back all the same.
func TestEndKeepsAnEndAlreadyWritten(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.started(t, "done")
	if _, err := r.log.Append(ctx, "done", events.TypeDone, events.Done{RequestID: "done"}); err != nil {
		t.Fatal(err)
	}
	r.End(ctx, "done", enums.WORKFLOW_EXECUTION_STATUS_TERMINATED)
	last, _, err := r.log.Last(ctx, "done")
	if err != nil || last.Type != events.TypeDone {
		t.Fatalf("last event %+v (%v), want the done event kept", last, err)
	}
	if held, _ := r.inPool(t); held != 0 {
		t.Fatalf("%d permits held, want the gone request's given back", held)
	}
}

// A request is followed while it has readers; the last one to leave
// unregisters it, and it is no longer probed.
func TestFollowUnregistersAfterTheLastReader(t *testing.T) {
	r := newRig(t)
	r.Started("a") // not followed: nothing to note
	if r.followedCount("a") != -1 {
		t.Fatal("Started registered a request nobody follows")
	}
	first := r.Follow("a")
	second := r.Follow("a")
	r.Started("a")
	if n := r.followedCount("a"); n != 2 {
		t.Fatalf("%d readers, want 2", n)
	}
	first()
	if n := r.followedCount("a"); n != 1 {
		t.Fatalf("%d readers after one left, want 1", n)
	}
	if _, ok := r.nextTurn(); !ok {
		t.Fatal("a request with a reader left is not probed")
	}
	second()
	if n := r.followedCount("a"); n != -1 {
		t.Fatalf("%d readers after the last left, want it unregistered", n)
	}
	if id, ok := r.nextTurn(); ok {
		t.Fatalf("%s probed after its last reader left", id)
	}
	// Followed again, it starts over: not started until seen so.
	defer r.Follow("a")()
	if ids := r.startedIDs(); len(ids) != 0 {
		t.Fatalf("started %v, want none", ids)
	}
}

// followedCount is id's readers, -1 when it is not followed.
func (l *Sweeper) followedCount(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.followed[id]; ok {
		return f.readers
	}
	return -1
}

// Run checks every livenessInterval until its context ends.
func TestRunChecksUntilCancelled(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.started(t, "gone")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	deadline := time.Now().Add(livenessInterval + 5*time.Second)
	for {
		if _, ended := r.ended(t, "gone"); ended {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not ended within %v of Run", livenessInterval+5*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
