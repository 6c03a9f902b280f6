package follow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/follow/liveness"
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

const pool = "p"

// signal is one signal the fake Temporal was sent.
type signal struct {
	workflowID, name string
	arg              any
}

// fakeTemporal records signals and answers them with signalErr (nil: the
// workflow got it); it describes the workflows in status, and finds no
// other.
type fakeTemporal struct {
	client.Client

	mu        sync.Mutex
	signalErr error
	signals   []signal
	status    map[string]enums.WorkflowExecutionStatus
	described int
}

func (f *fakeTemporal) SignalWorkflow(_ context.Context, workflowID, _, name string, arg any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals = append(f.signals, signal{workflowID, name, arg})
	return f.signalErr
}

func (f *fakeTemporal) DescribeWorkflow(_ context.Context, workflowID, _ string) (*client.WorkflowExecutionDescription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.described++
	st, ok := f.status[workflowID]
	if !ok {
		return nil, serviceerror.NewNotFound("workflow not found")
	}
	return &client.WorkflowExecutionDescription{WorkflowExecutionMetadata: client.WorkflowExecutionMetadata{Status: st}}, nil
}

func (f *fakeTemporal) answer(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signalErr = err
}

func (f *fakeTemporal) sent() []signal {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.signals)
}

func (f *fakeTemporal) describes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.described
}

// notFound is Temporal's answer for a workflow that does not exist.
var notFound = serviceerror.NewNotFound("workflow not found")

type notifier struct{}

func (notifier) NotifyGranted(context.Context, string, string) (bool, error) { return false, nil }

// rig is a Follower over a fake Temporal and a real event log, hub and
// gate.
type rig struct {
	*Follower
	temporal *fakeTemporal
	prefix   string
	// stopHub stops the hub, as a shutting-down process does.
	stopHub func()
	logs    *testenv.SyncBuffer
}

// newRig builds a Follower polling queue positions every 20ms, with a
// minute of idle time before it looks for a workflow; mod changes that.
func newRig(t *testing.T, mod func(*Options)) *rig {
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
	hub := events.NewHub(rdb, log, events.HubOptions{Block: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = hub.Run(ctx); close(done) }()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)

	tc := &fakeTemporal{status: map[string]enums.WorkflowExecutionStatus{}}
	buf := &testenv.SyncBuffer{}
	logger := slog.New(slog.NewTextHandler(buf, nil))
	opts := Options{
		Temporal: tc, Events: log, Hub: hub, Gate: gate,
		Liveness:          liveness.New(tc, "ns", log, &holdings.Returner{Gate: gate, Notifier: notifier{}}, logger),
		QueuePollInterval: 20 * time.Millisecond, IdleTimeout: time.Minute, StopTTL: time.Minute, Logger: logger,
	}
	if mod != nil {
		mod(&opts)
	}
	f, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return &rig{Follower: f, temporal: tc, prefix: prefix, stopHub: stop, logs: buf}
}

// append writes one event of id's and returns its id.
func (r *rig) append(t *testing.T, id, typ string, data any) string {
	t.Helper()
	evID, err := r.events.Append(context.Background(), id, typ, data)
	if err != nil {
		t.Fatal(err)
	}
	return evID
}

// follow follows id's events after the event after in the background;
// the channel gets why it ended.
func (r *rig) follow(t *testing.T, ctx context.Context, id, after string, out Sink, positions bool) <-chan End {
	t.Helper()
	sub, err := r.hub.Subscribe(ctx, id, after)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	return r.followSub(ctx, sub, id, out, positions)
}

func (r *rig) followSub(ctx context.Context, sub *events.Subscription, id string, out Sink, positions bool) <-chan End {
	ended := make(chan End, 1)
	go func() { ended <- r.Follow(ctx, sub, id, out, positions) }()
	return ended
}

func (e End) String() string {
	return [...]string{"terminal", "client gone", "interrupted"}[e]
}

// await is how Follow ended, within a few seconds.
func await(t *testing.T, ended <-chan End) End {
	t.Helper()
	select {
	case e := <-ended:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return")
		return 0
	}
}

// eventually waits a few seconds for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sink records what Follow writes; its errors, if set, are its answers.
type sink struct {
	mu                               sync.Mutex
	evs                              []events.Event
	keepAlives, flushes              int
	writeErr, flushErr, keepAliveErr error
}

func (s *sink) Write(ev events.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return s.writeErr
	}
	s.evs = append(s.evs, ev)
	return nil
}

func (s *sink) KeepAlive() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepAlives++
	return s.keepAliveErr
}

func (s *sink) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes++
	return s.flushErr
}

func (s *sink) events() []events.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.evs)
}

func (s *sink) counts() (keepAlives, flushes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keepAlives, s.flushes
}

// written is what the sink was given, one word an event: its type, and a
// token's index or a queue event's position after it.
func (s *sink) written() []string {
	var out []string
	for _, ev := range s.events() {
		var v struct {
			Index    int `json:"index"`
			Position int `json:"position"`
		}
		_ = json.Unmarshal(ev.Data, &v)
		switch ev.Type {
		case events.TypeToken:
			out = append(out, fmt.Sprintf("token%d", v.Index))
		case events.TypeQueue:
			out = append(out, fmt.Sprintf("queue%d", v.Position))
		default:
			out = append(out, ev.Type)
		}
	}
	return out
}

// Follow writes a request's events in order, those written before it
// began and those after, each token once, and ends at the terminal event.
func TestFollowDeliversEventsToTheEnd(t *testing.T) {
	r := newRig(t, nil)
	ctx := context.Background()
	const id = "r"
	r.append(t, id, events.TypeAccepted, events.Accepted{RequestID: id})
	r.append(t, id, events.TypeStage, events.Stage{Stage: request.StageRetrieval})
	out := &sink{}
	ended := r.follow(t, ctx, id, "0", out, true)
	eventually(t, "the events written before Follow began are written", func() bool { return len(out.events()) == 2 })
	// Tokens written twice (retried writes), one after a later token.
	for _, i := range []int{0, 1, 1, 0, 2} {
		r.append(t, id, events.TypeToken, events.Token{Text: "w", Index: i})
	}
	r.append(t, id, events.TypeDone, events.Done{RequestID: id})
	if e := await(t, ended); e != EndTerminal {
		t.Fatalf("Follow ended %v, want terminal", e)
	}
	want := []string{"accepted", "stage", "token0", "token1", "token2", "done"}
	if got := out.written(); !slices.Equal(got, want) {
		t.Fatalf("wrote %v, want %v", got, want)
	}
	if _, flushes := out.counts(); flushes == 0 {
		t.Fatal("nothing was flushed")
	}
}

// A reader that resumes mid-stream starts at its event, and the first
// token it gets sets what counts as repeated.
func TestFollowFromTheMiddle(t *testing.T) {
	r := newRig(t, nil)
	const id = "r"
	r.append(t, id, events.TypeAccepted, events.Accepted{RequestID: id})
	after := r.append(t, id, events.TypeToken, events.Token{Index: 0})
	for _, i := range []int{1, 2, 2} {
		r.append(t, id, events.TypeToken, events.Token{Index: i})
	}
	r.append(t, id, events.TypeDone, events.Done{RequestID: id})
	out := &sink{}
	if e := await(t, r.follow(t, context.Background(), id, after, out, true)); e != EndTerminal {
		t.Fatalf("Follow ended %v, want terminal", e)
	}
	if got, want := out.written(), []string{"token1", "token2", "done"}; !slices.Equal(got, want) {
		t.Fatalf("wrote %v, want %v", got, want)
	}
}

// A client that cannot be written to, or whose context ends, is gone; a
// hub that stops (the process shuts down) interrupts the reader.
func TestFollowEndsWhenTheReaderCannotGoOn(t *testing.T) {
	boom := errors.New("broken pipe")
	for _, tc := range []struct {
		name string
		out  *sink
		// event writes an event once Follow runs.
		event bool
		// keepAlive, if set, is the keep-alive interval (else a minute).
		keepAlive time.Duration
		// cancel ends the reader's context; stopHub stops the hub.
		cancel, stopHub bool
		want            End
	}{
		{name: "write fails", out: &sink{writeErr: boom}, event: true, want: EndClientGone},
		{name: "flush fails", out: &sink{flushErr: boom}, event: true, want: EndClientGone},
		{name: "keep-alive fails", out: &sink{keepAliveErr: boom}, keepAlive: 20 * time.Millisecond, want: EndClientGone},
		{name: "keep-alive's flush fails", out: &sink{flushErr: boom}, keepAlive: 20 * time.Millisecond, want: EndClientGone},
		{name: "context ends", out: &sink{}, cancel: true, want: EndClientGone},
		{name: "hub stops", out: &sink{}, stopHub: true, want: EndInterrupted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			r.keepAlive = cmp.Or(tc.keepAlive, time.Minute)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ended := r.follow(t, ctx, "r", "0", tc.out, true)
			switch {
			case tc.event:
				r.append(t, "r", events.TypeAccepted, events.Accepted{RequestID: "r"})
			case tc.cancel:
				cancel()
			case tc.stopHub:
				r.stopHub()
			}
			if e := await(t, ended); e != tc.want {
				t.Fatalf("Follow ended %v, want %v", e, tc.want)
			}
		})
	}
}

// A quiet stream gets a keep-alive, flushed, every interval.
func TestFollowKeepsAQuietStreamAlive(t *testing.T) {
	r := newRig(t, nil)
	r.keepAlive = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	out := &sink{}
	ended := r.follow(t, ctx, "r", "0", out, true)
	eventually(t, "three keep-alives, each flushed", func() bool {
		k, f := out.counts()
		return k >= 3 && f >= k
	})
	cancel()
	if e := await(t, ended); e != EndClientGone {
		t.Fatalf("Follow ended %v, want client gone", e)
	}
	if len(out.events()) != 0 {
		t.Fatalf("a keep-alive wrote events: %v", out.written())
	}
}

// While a request waits in the queue, Follow writes a queue event each
// time its position from the gate changes — if asked for positions, once
// its workflow started (before that a door reports its place), and until
// a stage past admission shows it left the queue.
func TestFollowReportsQueuePositions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		positions bool
		// stage is written after the request's queue event ("": none).
		stage string
		// resumed: the stage is written first, and the reader follows
		// from after it, as a client resuming with Last-Event-ID.
		resumed bool
		want    []string
	}{
		{name: "at a door", positions: true, want: []string{"queue9"}},
		{name: "waiting in admission", positions: true, stage: request.StageAdmission, want: []string{"queue9", "stage", "queue2", "queue1"}},
		{name: "resumed past its stage", positions: true, stage: request.StageAdmission, resumed: true, want: []string{"queue9", "queue2", "queue1"}},
		{name: "no positions", positions: false, stage: request.StageAdmission, want: []string{"queue9", "stage"}},
		{name: "past the queue", positions: true, stage: request.StageRetrieval, want: []string{"queue9", "stage"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			ctx := context.Background()
			// holder holds the pool's permit; ahead and r queue behind it.
			for _, id := range []string{"holder", "ahead", "r"} {
				if _, err := r.gate.Enqueue(ctx, pool, admission.Request{ID: id, Tenant: id, Weight: 1}); err != nil {
					t.Fatal(err)
				}
			}
			after := "0"
			if tc.resumed {
				after = r.append(t, "r", events.TypeStage, events.Stage{Stage: tc.stage, Pool: pool})
			}
			// A stale position, which the gate's corrects.
			r.append(t, "r", events.TypeQueue, events.Queue{Position: 9, Pool: pool})
			if tc.stage != "" && !tc.resumed {
				r.append(t, "r", events.TypeStage, events.Stage{Stage: tc.stage, Pool: pool})
			}
			out := &sink{}
			ended := r.follow(t, ctx, "r", after, out, tc.positions)
			// wrote waits for the sink to have n events, or, when no more
			// are due, for ten polls that write none.
			wrote := func(n int) {
				if n > len(tc.want) {
					time.Sleep(10 * r.opts.QueuePollInterval)
					return
				}
				eventually(t, fmt.Sprintf("%d events written", n), func() bool { return len(out.events()) >= n })
			}
			base := 1
			if tc.stage != "" && !tc.resumed {
				base = 2
			}
			wrote(base + 1)
			if _, err := r.gate.Release(ctx, pool, "ahead"); err != nil {
				t.Fatal(err)
			}
			wrote(base + 2)
			r.append(t, "r", events.TypeDone, events.Done{RequestID: "r"})
			if e := await(t, ended); e != EndTerminal {
				t.Fatalf("Follow ended %v, want terminal", e)
			}
			want := append(slices.Clone(tc.want), "done")
			if got := out.written(); !slices.Equal(got, want) {
				t.Fatalf("wrote %v, want %v", got, want)
			}
			for _, ev := range out.events() {
				var q events.Queue
				if ev.Type == events.TypeQueue && (json.Unmarshal(ev.Data, &q) != nil || q.Pool != pool) {
					t.Fatalf("queue event %s names pool %q, want %q", ev.Data, q.Pool, pool)
				}
			}
		})
	}
}

// A stream quiet for the idle timeout looks for its workflow, if the
// request's log shows it started (a stage, also one written before the
// reader's first event): one that is gone gets its error event, which
// ends the stream. A request at the door is not looked for; a running one
// goes on.
func TestFollowLooksForTheWorkflowOfAQuietStream(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stage: the request's workflow wrote a stage; pastStage: the
		// reader joined after it.
		stage, pastStage bool
		running          bool
		lookedFor, ended bool
	}{
		{name: "gone, its stage seen", stage: true, lookedFor: true, ended: true},
		{name: "gone, joined past its stage", stage: true, pastStage: true, lookedFor: true, ended: true},
		{name: "running", stage: true, running: true, lookedFor: true},
		{name: "at the door", lookedFor: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, func(o *Options) { o.IdleTimeout = 30 * time.Millisecond })
			const id = "r"
			after := r.append(t, id, events.TypeAccepted, events.Accepted{RequestID: id})
			if tc.stage {
				stageID := r.append(t, id, events.TypeStage, events.Stage{Stage: request.StageRetrieval})
				if tc.pastStage {
					after = stageID
				} else {
					after = "0"
				}
			}
			if tc.running {
				r.temporal.status[workflows.ChatWorkflowID(id)] = enums.WORKFLOW_EXECUTION_STATUS_RUNNING
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			out := &sink{}
			ended := r.follow(t, ctx, id, after, out, true)
			if tc.ended {
				if e := await(t, ended); e != EndTerminal {
					t.Fatalf("Follow ended %v, want terminal", e)
				}
				evs := out.events()
				var f events.Failure
				if last := evs[len(evs)-1]; last.Type != events.TypeError || json.Unmarshal(last.Data, &f) != nil || f.Reason != request.ReasonInternal {
					t.Fatalf("last event %s %s, want an internal error", last.Type, last.Data)
				}
				return
			}
			if tc.lookedFor {
				eventually(t, "the workflow looked for", func() bool { return r.temporal.describes() > 0 })
				// A few more quiet spells, in which it must not be ended.
				time.Sleep(3 * r.opts.IdleTimeout)
			} else {
				time.Sleep(10 * r.opts.IdleTimeout)
				if r.temporal.describes() > 0 {
					t.Fatal("the workflow of a request at the door was looked for")
				}
			}
			cancel()
			if e := await(t, ended); e != EndClientGone {
				t.Fatalf("Follow ended %v, want client gone", e)
			}
			if slices.Contains(out.written(), events.TypeError) {
				t.Fatalf("wrote %v: a live request was ended", out.written())
			}
		})
	}
}

func TestNewNeedsItsDependencies(t *testing.T) {
	r := newRig(t, nil)
	for _, tc := range []struct {
		name string
		mod  func(*Options)
	}{
		{"no Temporal", func(o *Options) { o.Temporal = nil }},
		{"no events", func(o *Options) { o.Events = nil }},
		{"no hub", func(o *Options) { o.Hub = nil }},
		{"no gate", func(o *Options) { o.Gate = nil }},
		{"no liveness", func(o *Options) { o.Liveness = nil }},
		{"no poll interval", func(o *Options) { o.QueuePollInterval = 0 }},
		{"negative idle timeout", func(o *Options) { o.IdleTimeout = -time.Second }},
		{"no stop ttl", func(o *Options) { o.StopTTL = 0 }},
	} {
		opts := r.opts
		tc.mod(&opts)
		if _, err := New(opts); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
	opts := r.opts
	opts.Logger = nil
	if f, err := New(opts); err != nil || f.logger == nil || f.keepAlive != keepAliveInterval {
		t.Fatalf("New without a logger: %v, %v", f, err)
	}
}

// closedClient is a Redis client that fails every call.
func closedClient() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	_ = c.Close()
	return c
}

// A hub that stops just after it handed the reader events (one wake-up
// for both) still interrupts the reader once it wrote them.
func TestFollowIsInterruptedAfterTheLastEventsBeforeTheHubStopped(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := r.hub.Subscribe(ctx, "r", "0")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	r.append(t, "r", events.TypeAccepted, events.Accepted{RequestID: "r"})
	// Let the hub hand the event over, then stop it, before Follow looks.
	time.Sleep(300 * time.Millisecond)
	r.stopHub()
	out := &sink{}
	ended := r.followSub(ctx, sub, "r", out, true)
	select {
	case e := <-ended:
		if e != EndInterrupted {
			t.Fatalf("Follow ended %v, want interrupted", e)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("Follow wrote %v and then waited on a subscription that had ended", out.written())
	}
}
