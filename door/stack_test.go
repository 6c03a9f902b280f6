package door_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/follow/liveness"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/worker"
	"github.com/sluice-dev/sluice/workflows"
	wfsignal "github.com/sluice-dev/sluice/workflows/signal"
)

var redisAddr string

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { redisAddr = r.Addr }))
}

// meteredTier is the tier the tests' callers have unless a test says
// otherwise: limits whose buckets refill so slowly (a tenth of a token, a
// hundredth of a request a second) that what a test reads of them is what
// the door charged and gave back.
func meteredTier() policy.Tier {
	return policy.Tier{
		Weight: 3, MaxQueuePerTenant: 100, MaxWait: 20 * time.Second, MaxConcurrent: 4,
		Tenant: policy.Rate{TokensPerMinute: 6, TokenBurst: 100000, RequestsPerMinute: 0.6, RequestBurst: 100},
	}
}

// acme is the caller of most tests.
var acme = door.Caller{Tenant: "acme", User: "ann", Tier: "metered", KeyID: "key-acme", IP: "10.0.0.7",
	Scopes: keys.Scopes{keys.ScopeChat}}

// stack is a door built as app.RunAPI builds it, on the test's Redis in a
// key space of the test's own, with a fake Temporal; the stores it holds
// are the door's, for the test to read what the door did.
type stack struct {
	t        *testing.T
	cfg      config.Config
	rdb      *redis.Client
	door     *door.Door
	temporal *fakeTemporal
	events   *events.Log
	gate     *admission.Gate
	limiter  *limiter.Limiter
	budgets  *budget.Counter
	idem     *idempotency.Store
	sessions *session.Store
	kbs      *kbstore.Store
	bans     *ban.Guard
	policy   *policy.Store
	prompts  *prompt.Builder
	metrics  *metrics.Metrics
	logs     *testenv.SyncBuffer
}

// deps replace a stack's own dependencies.
type deps struct {
	// banAddr and limiterAddr, if set, are where the ban store and the
	// rate limiter talk to instead of the test's Redis.
	banAddr, limiterAddr string
}

// newStack builds a door under the tests' configuration, changed by mod.
func newStack(t *testing.T, mod func(*config.Config)) *stack {
	return newStackWith(t, mod, deps{})
}

func newStackWith(t *testing.T, mod func(*config.Config), with deps) *stack {
	t.Helper()
	cfg := config.Default()
	cfg.Redis.KeyPrefix = testenv.KeyPrefix(t)
	cfg.Redis.RequestTimeout = 500 * time.Millisecond
	cfg.API.QueuePollInterval = 20 * time.Millisecond
	cfg.Limits.Tiers["metered"] = meteredTier()
	cfg.Limits.DefaultTier = "metered"
	cfg.Limits.Ban.Enabled = true
	cfg.Limits.Ban.Threshold = 2
	cfg.AnswerCache.KBs = []string{"sluice-docs"}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rdb := redisClient(t, redisAddr)
	ctx := context.Background()
	// What an earlier run of the test left (-count=N) is not this run's.
	if old, _ := rdb.Keys(ctx, cfg.Redis.KeyPrefix+"*").Result(); len(old) > 0 {
		rdb.Del(ctx, old...)
	}
	logs := &testenv.SyncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	s := &stack{t: t, cfg: cfg, rdb: rdb, temporal: &fakeTemporal{}, logs: logs, metrics: metrics.New(logger)}
	tok, err := tokens.For(cfg.Routing.Encoding)
	if err != nil {
		t.Fatal(err)
	}
	s.prompts = prompt.NewBuilder(cfg.LLM.SystemPrompt, tok)
	s.events = events.NewLog(rdb, events.LogOptions{KeyPrefix: cfg.Redis.KeyPrefix, TTL: cfg.Events.TTL, MaxLen: cfg.Events.MaxLen})
	if s.gate, err = admission.New(rdb, app.GateOptions(cfg)); err != nil {
		t.Fatal(err)
	}
	s.policy = worker.NewPolicy(rdb, cfg, s.gate, logger)
	limiterRedis := rdb
	if with.limiterAddr != "" {
		limiterRedis = redisClient(t, with.limiterAddr)
	}
	s.limiter = limiter.New(limiterRedis, limiter.Options{KeyPrefix: cfg.Redis.KeyPrefix, ReservationTTL: time.Hour})
	t.Cleanup(s.limiter.Close)
	s.budgets = app.NewBudgets(rdb, cfg, nil)
	if s.sessions, err = session.New(rdb, session.Options{KeyPrefix: cfg.Redis.KeyPrefix, TTL: cfg.Sessions.TTL, MaxTurns: cfg.Sessions.MaxTurns}); err != nil {
		t.Fatal(err)
	}
	s.kbs = kbstore.New(rdb, kbstore.Options{Prefix: cfg.Redis.KeyPrefix})
	s.idem = idempotency.New(rdb, cfg.Redis.KeyPrefix, cfg.API.IdempotencyTTL)
	addresses := iphash.New([]byte(cfg.Privacy.IPHashKey))
	banRedis := rdb
	if with.banAddr != "" {
		banRedis = redisClient(t, with.banAddr)
	}
	b := cfg.Limits.Ban
	if s.bans, err = ban.New(banRedis, ban.Options{KeyPrefix: cfg.Redis.KeyPrefix, Threshold: b.Threshold, Window: b.Window,
		Duration: b.Duration, Exempt: b.ExemptPrefixes(), Addresses: addresses}); err != nil {
		t.Fatal(err)
	}
	// A short block: the hub stops within it when the test ends.
	hub := events.NewHub(rdb, s.events, events.HubOptions{Block: 50 * time.Millisecond})
	returner := &holdings.Returner{Gate: s.gate, Notifier: wfsignal.Notifier{Client: s.temporal}, Limiter: s.limiter,
		Budgets: s.budgets, Keys: s.idem, Logger: logger}
	sweeper := liveness.New(s.temporal, cfg.Temporal.Namespace, s.events, returner, logger)
	follower, err := follow.New(follow.Options{Temporal: s.temporal, Events: s.events, Hub: hub, Gate: s.gate, Liveness: sweeper,
		QueuePollInterval: cfg.API.QueuePollInterval, IdleTimeout: cfg.API.StreamIdleTimeout, StopTTL: cfg.Events.TTL, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	room, err := door.NewRoom(cfg, s.gate, s.policy, logger)
	if err != nil {
		t.Fatal(err)
	}
	s.door, err = door.New(door.Options{Config: cfg, Temporal: s.temporal, Events: s.events, Hub: hub, Gate: s.gate,
		Prompts: s.prompts, Policy: s.policy, Room: room, Attacher: follower, Idempotency: s.idem, Returner: returner,
		Limiter: s.limiter, Budgets: s.budgets, Bans: s.bans, KBs: s.kbs, Sessions: s.sessions, Metrics: s.metrics,
		Addresses: addresses, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Add(2)
	go func() { defer loops.Done(); _ = hub.Run(runCtx) }()
	go func() { defer loops.Done(); room.Run(runCtx) }()
	t.Cleanup(func() { stop(); loops.Wait() })
	return s
}

// redisClient is a go-redis client of addr as the process builds it: a
// caller's deadline bounds its network waits.
func redisClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// request is a validated chat request of query with max tokens.
func (s *stack) request(query string, maxTokens int) *door.Request {
	s.t.Helper()
	req := &door.Request{Query: query, MaxTokens: &maxTokens}
	if err := s.door.Validate(req); err != nil {
		s.t.Fatalf("validate %q: %v", query, err)
	}
	return req
}

// admit admits req for who and fails the test unless it was admitted;
// the subscription is closed with the test.
func (s *stack) admit(who door.Caller, req *door.Request) door.Admission {
	s.t.Helper()
	adm, err := s.door.Admit(context.Background(), who, req)
	if err != nil {
		s.t.Fatalf("admit %q: %v", req.Query, err)
	}
	s.t.Cleanup(adm.Sub.Close)
	return adm
}

// refusal is err as a refusal; it fails the test if err is none.
func refusalOf(t *testing.T, err error) *refusal.Error {
	t.Helper()
	var re *refusal.Error
	if !errors.As(err, &re) {
		t.Fatalf("got %T %v, want a *refusal.Error", err, err)
	}
	return re
}

// level is what the bucket of dimension, id and kind holds as of its last
// change; a bucket never charged is full (ok false).
func (s *stack) level(dimension, id string, kind limiter.Kind) (float64, bool) {
	s.t.Helper()
	group := limiter.TenantGroup(id)
	key := s.cfg.Redis.KeyPrefix + "rl3:{" + group + "}:" + dimension + ":" + id + ":" + string(kind)
	raw, err := s.rdb.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false
	}
	if err != nil {
		s.t.Fatal(err)
	}
	l, ok := limiter.StoredLevel(raw)
	if !ok {
		s.t.Fatalf("bucket %s holds %q", key, raw)
	}
	return l, true
}

// tenantTokens and tenantRequests are the levels of acme's buckets under
// meteredTier (its bursts when never charged).
func (s *stack) tenantTokens() float64 {
	if l, ok := s.level("tenant", acme.Tenant, limiter.Tokens); ok {
		return l
	}
	return meteredTier().Tenant.TokenBurst
}

func (s *stack) tenantRequests() float64 {
	if l, ok := s.level("tenant", acme.Tenant, limiter.Requests); ok {
		return l
	}
	return meteredTier().Tenant.RequestBurst
}

// near fails unless got is want within what meteredTier's buckets refill
// while a test runs.
func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if got < want-0.5 || got > want+0.5 {
		t.Errorf("%s: %.2f, want %.2f", what, got, want)
	}
}

// budgetUsed is what tenant's month has used, open reservations included.
func (s *stack) budgetUsed(tenant string) budget.Used {
	s.t.Helper()
	st, err := s.budgets.Status(context.Background(), tenant, budget.Limit{Tokens: 1})
	if err != nil {
		s.t.Fatal(err)
	}
	return st.Used
}

// placesReserved counts tenant's places reserved in any pool's fair
// order (admission.Gate.Reserve), as the gate counts them.
func (s *stack) placesReserved(tenant string) int {
	s.t.Helper()
	ctx := context.Background()
	keys, err := s.rdb.Keys(ctx, s.cfg.Redis.KeyPrefix+"adm:*reserved").Result()
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, k := range keys {
		v, err := s.rdb.HGet(ctx, k, tenant).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		count, _, _ := strings.Cut(v, ":")
		c, err := strconv.Atoi(count)
		if err != nil {
			s.t.Fatalf("reserved places %q", v)
		}
		n += c
	}
	return n
}

// streams counts the event streams in the test's key space.
func (s *stack) streams() int {
	s.t.Helper()
	keys, err := s.rdb.Keys(context.Background(), s.cfg.Redis.KeyPrefix+"ev:*").Result()
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, k := range keys {
		if _, ok := s.events.RequestID(k); ok {
			n++
		}
	}
	return n
}

// stream is every event of request id.
func (s *stack) stream(id string) []events.Event {
	s.t.Helper()
	evs, err := s.events.After(context.Background(), id, "0", 1000)
	if err != nil {
		s.t.Fatal(err)
	}
	return evs
}

// terminal waits for request id's stream to end and returns its last
// event and its failure.
func (s *stack) terminal(id string) (events.Event, events.Failure) {
	s.t.Helper()
	var last events.Event
	eventually(s.t, "request "+id+" to end", func() bool {
		ev, ok, err := s.events.Last(context.Background(), id)
		last = ev
		return err == nil && ok && events.Terminal(ev.Type)
	})
	var f events.Failure
	if err := json.Unmarshal(last.Data, &f); err != nil {
		s.t.Fatalf("terminal event %s: %v", last.Data, err)
	}
	return last, f
}

// finished are the "request finished" lines logged so far with reason
// (every one when reason is "").
func (s *stack) finished(reason string) []map[string]any {
	var out []map[string]any
	for _, l := range testenv.FinishedLines(s.logs.String()) {
		if reason == "" || l["reason"] == reason {
			out = append(out, l)
		}
	}
	return out
}

// counted is sluice_requests_total of outcome.
func (s *stack) counted(outcome string) float64 {
	s.t.Helper()
	fams, err := s.metrics.Registry().Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "sluice_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// eventually polls cond every 5 ms for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !settles(cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// settles polls cond every 5 ms for up to 5 s, and reports whether it
// came true; the caller says what is wrong if it did not.
func settles(cond func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// fakeTemporal is a Temporal client that records the workflows the door
// starts and starts none; any call the door should not make panics.
type fakeTemporal struct {
	client.Client
	// fail, if set, is what every start returns.
	fail atomic.Pointer[error]
	// exists: DescribeWorkflow finds every workflow (a start that
	// reported an error went through after all).
	exists atomic.Bool
	// hold, if set, keeps each start in flight until it is closed;
	// holding receives once per start that began.
	hold, holding chan struct{}
	// signals counts the signals the door sent.
	signals atomic.Int64

	mu     sync.Mutex
	starts []started
}

// started is one workflow start.
type started struct {
	opts client.StartWorkflowOptions
	in   workflows.ChatInput
}

func (f *fakeTemporal) ExecuteWorkflow(_ context.Context, opts client.StartWorkflowOptions, name any, args ...any) (client.WorkflowRun, error) {
	in, _ := args[0].(workflows.ChatInput)
	if name != workflows.ChatWorkflowName || len(args) != 1 {
		panic("door started something other than a chat workflow")
	}
	f.mu.Lock()
	f.starts = append(f.starts, started{opts: opts, in: in})
	f.mu.Unlock()
	if f.hold != nil {
		f.holding <- struct{}{}
		<-f.hold
	}
	if err := f.fail.Load(); err != nil {
		return nil, *err
	}
	return nil, nil
}

func (f *fakeTemporal) DescribeWorkflow(context.Context, string, string) (*client.WorkflowExecutionDescription, error) {
	if f.exists.Load() {
		return &client.WorkflowExecutionDescription{}, nil
	}
	return nil, serviceerror.NewNotFound("no such workflow")
}

// SignalWorkflow finds no workflow: none was started.
func (f *fakeTemporal) SignalWorkflow(context.Context, string, string, string, any) error {
	f.signals.Add(1)
	return serviceerror.NewNotFound("no such workflow")
}

// failStarts makes every start fail with err (nil: succeed).
func (f *fakeTemporal) failStarts(err error) {
	if err == nil {
		f.fail.Store(nil)
		return
	}
	f.fail.Store(&err)
}

// inputs are the inputs of the workflows started so far.
func (f *fakeTemporal) inputs() []workflows.ChatInput {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]workflows.ChatInput, len(f.starts))
	for i, s := range f.starts {
		out[i] = s.in
	}
	return out
}

// only is the input of the one workflow started; it fails the test if
// there was not exactly one.
func (f *fakeTemporal) only(t *testing.T) started {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.starts) != 1 {
		t.Fatalf("%d workflows started, want 1", len(f.starts))
	}
	return f.starts[0]
}
