package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/follow/liveness"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/pkg/version"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/worker"
	"github.com/sluice-dev/sluice/workflows"
	"github.com/sluice-dev/sluice/workflows/signal"
)

var redisAddr string

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { redisAddr = r.Addr }))
}

// countingClient is a Temporal client that only counts workflow starts;
// any other call panics, so a test touching Temporal unexpectedly fails.
type countingClient struct {
	client.Client
	starts atomic.Int32
	// hold, if set, keeps each start in flight until it is closed;
	// holding receives once per start that began.
	hold, holding chan struct{}

	mu     sync.Mutex
	inputs []workflows.ChatInput
	// signals are the names of the signals sent, in order.
	signals []string
	// startedAnyway: a start reported as failed did start the workflow.
	startedAnyway atomic.Bool
}

// DescribeWorkflow finds a workflow only if startedAnyway says a failed
// start went through after all.
func (c *countingClient) DescribeWorkflow(context.Context, string, string) (*client.WorkflowExecutionDescription, error) {
	if c.startedAnyway.Load() {
		return &client.WorkflowExecutionDescription{}, nil
	}
	return nil, serviceerror.NewNotFound("no workflows in this test")
}

func (c *countingClient) ExecuteWorkflow(_ context.Context, _ client.StartWorkflowOptions, _ any, args ...any) (client.WorkflowRun, error) {
	c.starts.Add(1)
	if len(args) == 1 {
		if in, ok := args[0].(workflows.ChatInput); ok {
			c.mu.Lock()
			c.inputs = append(c.inputs, in)
			c.mu.Unlock()
		}
	}
	if c.hold != nil {
		c.holding <- struct{}{}
		<-c.hold
	}
	return nil, fmt.Errorf("not starting workflows in this test")
}

// ListWorkflow finds no workflows: this client starts none. (The
// liveness check of a running server searches for closed ones.)
func (c *countingClient) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	return &workflowservice.ListWorkflowExecutionsResponse{}, nil
}

// SignalWorkflow records the signal and finds no workflow: this client
// starts none.
func (c *countingClient) SignalWorkflow(_ context.Context, _, _, name string, _ any) error {
	c.mu.Lock()
	c.signals = append(c.signals, name)
	c.mu.Unlock()
	return serviceerror.NewNotFound("no workflows in this test")
}

// sent reports whether a signal of this name was sent.
func (c *countingClient) sent(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.signals {
		if s == name {
			return true
		}
	}
	return false
}

func newTestServer(t *testing.T, mod func(*config.Config)) (*Server, *countingClient, *redis.Client) {
	return newTestServerWith(t, mod, nil)
}

// testHubs are the test servers' event hubs, for the tests that run them.
var testHubs sync.Map // *Server -> *events.Hub

// newTestServerWith is newTestServer with dependencies of the test's own:
// with, if set, changes the server's options before the door and the
// server are built from them.
func newTestServerWith(t *testing.T, mod func(*config.Config), with func(rdb *redis.Client, o *Options)) (*Server, *countingClient, *redis.Client) {
	t.Helper()
	return newTestServerOn(t, redisAddr, mod, with)
}

// newTestServerOn is newTestServerWith on the Redis at addr.
func newTestServerOn(t *testing.T, addr string, mod func(*config.Config), with func(rdb *redis.Client, o *Options)) (*Server, *countingClient, *redis.Client) {
	t.Helper()
	return buildTestServerOn(t, addr, mod, with)
}

// buildTestServerOn is newTestServerOn without running the door.
func buildTestServerOn(t *testing.T, addr string, mod func(*config.Config), with func(rdb *redis.Client, o *Options)) (*Server, *countingClient, *redis.Client) {
	t.Helper()
	cfg := config.Default()
	cfg.Auth.APIKeys = []config.APIKey{{Key: "k-acme", Tenant: "acme", Tier: "vip", Scopes: []string{"chat", "ingest"}}}
	cfg.API.MaxQueryChars = 200
	cfg.API.MaxBodyBytes = 1024
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// As the process builds it: a caller's deadline bounds network waits.
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := "t:" + t.Name() + ":"
	// A test's keys are named for it: what an earlier run of it left
	// (go test -count=N) must not be read as this run's.
	if old, _ := rdb.Keys(context.Background(), prefix+"*").Result(); len(old) > 0 {
		rdb.Del(context.Background(), old...)
	}
	log := events.NewLog(rdb, events.LogOptions{KeyPrefix: prefix})
	gate, err := admission.New(rdb, admission.Options{KeyPrefix: prefix, Lease: time.Second, WaiterTTL: time.Second, MaxQueueDepth: 10, Limits: map[string]int{"short": 1, "long": 1}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokens.For(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	tc := &countingClient{}
	opts := Options{Config: cfg, Temporal: tc, Redis: rdb, Events: log, Gate: gate,
		Prompts: prompt.NewBuilder(cfg.LLM.SystemPrompt, tok), Metrics: metrics.New(nil), Logger: slog.Default(),
		Policy: worker.NewPolicy(rdb, cfg, gate, slog.Default()), Addresses: iphash.New([]byte(cfg.Privacy.IPHashKey))}
	if cfg.Codec.Enabled {
		// withCodec configured the test's key.
		if opts.Codec, err = testKeyring(); err != nil {
			t.Fatal(err)
		}
	}
	if with != nil {
		with(rdb, &opts)
	}
	hub := events.NewHub(rdb, log, events.HubOptions{})
	lim := limiter.New(rdb, limiter.Options{KeyPrefix: prefix})
	// As the app runs them: the waiting room and the liveness sweep.
	idem := idempotency.New(rdb, cfg.Redis.KeyPrefix, cfg.API.IdempotencyTTL)
	returner := &holdings.Returner{Gate: gate, Notifier: signal.Notifier{Client: opts.Temporal}, Limiter: lim, Budgets: opts.Budgets, Keys: idem}
	sweeper := liveness.New(opts.Temporal, cfg.Temporal.Namespace, log, returner, opts.Logger)
	if opts.Follow, err = follow.New(follow.Options{Temporal: opts.Temporal, Events: log, Hub: hub, Gate: gate, Liveness: sweeper,
		QueuePollInterval: cfg.API.QueuePollInterval, IdleTimeout: cfg.API.StreamIdleTimeout, StopTTL: cfg.Events.TTL,
		Logger: opts.Logger}); err != nil {
		t.Fatal(err)
	}
	room, err := door.NewRoom(cfg, gate, opts.Policy, opts.Logger)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go room.Run(ctx)
	go sweeper.Run(ctx)
	opts.Door, err = door.New(door.Options{Config: cfg, Temporal: opts.Temporal, Events: log, Hub: hub, Gate: gate,
		Prompts: opts.Prompts, Policy: opts.Policy, Room: room, Attacher: opts.Follow,
		Idempotency: idem, Returner: returner,
		Limiter: lim, Budgets: opts.Budgets, Bans: opts.Bans, KBs: opts.KBs, Sessions: opts.Sessions,
		Metrics: opts.Metrics, Addresses: opts.Addresses, Logger: opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	uncheckedHandlers.Store(srv, srv.handler)
	srv.handler = specChecked(t, srv.echo, srv.handler)
	testHubs.Store(srv, hub)
	testLimiters.Store(srv, lim)
	return srv, tc, rdb
}

// testLimiters are the test servers' door limiters.
var testLimiters sync.Map // *Server -> *limiter.Limiter

// limiterOf is the test server's rate limiter: Reserve on it drains the
// buckets the door charges, as another instance would.
func limiterOf(srv *Server) *limiter.Limiter {
	l, _ := testLimiters.Load(srv)
	return l.(*limiter.Limiter)
}

// hubOf is the test server's event hub.
func hubOf(srv *Server) *events.Hub {
	h, _ := testHubs.Load(srv)
	return h.(*events.Hub)
}

func TestBadChatInputIsRefusedBeforeAnythingStarts(t *testing.T) {
	srv, tc, rdb := newTestServer(t, func(c *config.Config) { c.Auth.AllowAnonymous = false })
	long := strings.Repeat("a", 201)
	cases := []struct {
		name, body, contentType, auth string
		status                        int
		code                          string
	}{
		{"malformed json", `{"query": "hi"`, "application/json", "Bearer k-acme", 400, "bad_json"},
		{"not an object", `["hi"]`, "application/json", "Bearer k-acme", 400, "bad_json"},
		{"empty body", ``, "application/json", "Bearer k-acme", 400, "bad_json"},
		{"trailing data", `{"query":"hi"} {"x":1}`, "application/json", "Bearer k-acme", 400, "bad_json"},
		{"trailing bracket", `{"query":"hi"}]`, "application/json", "Bearer k-acme", 400, "bad_json"},
		{"unknown field", `{"query":"hi","max_token":5}`, "application/json", "Bearer k-acme", 400, "bad_json"},
		{"wrong type", `{"query": 42}`, "application/json", "Bearer k-acme", 400, "bad_json"},
		{"empty query", `{"query":"   "}`, "application/json", "Bearer k-acme", 400, "empty_query"},
		{"missing query", `{"kb":"sluice-docs"}`, "application/json", "Bearer k-acme", 400, "empty_query"},
		{"oversized query", `{"query":"` + long + `"}`, "application/json", "Bearer k-acme", 413, "query_too_long"},
		{"oversized body", `{"query":"` + strings.Repeat("b", 2000) + `"}`, "application/json", "Bearer k-acme", 413, "body_too_large"},
		{"unknown kb", `{"query":"hi","kb":"nope"}`, "application/json", "Bearer k-acme", 400, "unknown_kb"},
		{"zero max_tokens", `{"query":"hi","max_tokens":0}`, "application/json", "Bearer k-acme", 400, "bad_max_tokens"},
		{"huge max_tokens", `{"query":"hi","max_tokens":999999}`, "application/json", "Bearer k-acme", 400, "bad_max_tokens"},
		{"bad session id", `{"query":"hi","session_id":"a b"}`, "application/json", "Bearer k-acme", 400, "bad_session_id"},
		{"wrong content type", `query=hi`, "application/x-www-form-urlencoded", "Bearer k-acme", 415, "unsupported_media_type"},
		{"no api key", `{"query":"hi"}`, "application/json", "", 401, "unauthorized"},
		{"unknown api key", `{"query":"hi"}`, "application/json", "Bearer nope", 401, "unauthorized"},
		{"bad auth scheme", `{"query":"hi"}`, "application/json", "Basic abc", 401, "unauthorized"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.contentType)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, req)
			assertJSONError(t, rec, tc.status, tc.code)
		})
	}
	if n := tc.starts.Load(); n != 0 {
		t.Fatalf("%d workflows started by bad input", n)
	}
	keys, _ := rdb.Keys(context.Background(), "t:"+t.Name()+"*").Result()
	if len(keys) != 0 {
		t.Fatalf("bad input wrote to redis: %v", keys)
	}
}

func TestQueryTooLongForLongPool(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.API.MaxQueryChars = 100000
		c.API.MaxBodyBytes = 1 << 20
		c.Pools.Long.MaxPromptTokens = 600
	})
	body := `{"query":"` + strings.Repeat("word ", 700) + `"}`
	req := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	assertJSONError(t, rec, 413, "query_too_long")
	if tc.starts.Load() != 0 {
		t.Fatal("workflow started")
	}
}

func TestStartFailureIs503AndCleansUp(t *testing.T) {
	srv, tc, rdb := newTestServer(t, nil)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(`{"query":"hello"}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	assertJSONError(t, rec, 503, "unavailable")
	if rec.Header().Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if tc.starts.Load() != 1 {
		t.Fatalf("starts = %d", tc.starts.Load())
	}
	keys, _ := rdb.Keys(context.Background(), "t:"+t.Name()+":ev:*").Result()
	if len(keys) != 0 {
		t.Fatalf("failed start left its event stream behind: %v", keys)
	}
}

func TestRequestRoutesValidateIDs(t *testing.T) {
	srv, _, _ := newTestServer(t, nil)
	for _, tc := range []struct {
		method, path string
		header       map[string]string
		status       int
		code         string
	}{
		{"GET", "/v1/requests/nope", nil, 400, "bad_request_id"},
		{"DELETE", "/v1/requests/chat-123", nil, 400, "bad_request_id"},
		{"GET", "/v1/requests/chat-01JABCDEFGHJKMNPQRSTVWXYZ0/events", map[string]string{"Last-Event-ID": "x"}, 400, "bad_last_event_id"},
		{"GET", "/v1/requests/chat-01JABCDEFGHJKMNPQRSTVWXYZ0/events", nil, 404, "not_found"},
		{"GET", "/v1/nothing", nil, 404, "not_found"},
		{"PUT", "/v1/chat", nil, 405, "method_not_allowed"},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		t.Run(tc.method+tc.path, func(t *testing.T) { assertJSONError(t, rec, tc.status, tc.code) })
	}
}

func limitedConfig(c *config.Config) {
	c.Auth.APIKeys[0].Tier = "standard"
	c.Limits.Tiers = map[string]policy.Tier{
		"standard": {Weight: 3, Tenant: policy.Rate{TokensPerMinute: 6000}, IP: policy.Rate{RequestsPerMinute: 60}},
	}
}

func post(srv *Server, body string) *httptest.ResponseRecorder {
	return call(srv, http.MethodPost, "/v1/chat", body)
}

// call sends body as JSON with acme's API key.
func call(srv *Server, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k-acme")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}

// A drained bucket answers 429 with Retry-After, the rate-limit headers and
// the refusing dimension, and starts nothing.
func TestRateLimitedIs429WithHeaders(t *testing.T) {
	srv, tc, _ := newTestServer(t, limitedConfig)
	// Drain the tenant's 6000-token bucket from "another instance".
	drain := door.RatesOf(srv.policy.Current().Limits.Tiers["standard"]).Buckets(limiter.Caller{Tenant: "acme"}, 5990)
	if d, err := limiterOf(srv).Reserve(context.Background(), "other", drain); err != nil || d.Status != limiter.Allowed {
		t.Fatalf("drain: %+v %v", d, err)
	}
	rec := post(srv, `{"query":"how does a token bucket refill?","max_tokens":64}`)
	assertJSONError(t, rec, 429, "rate_limited")
	var body struct {
		Error refusal.Error `json:"error"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if body.Error.Dimension != "tenant" || body.Error.Kind != "tokens" || body.Error.RetryAfter < 1 {
		t.Fatalf("429 body %+v", body.Error)
	}
	h := rec.Header()
	if h.Get("Retry-After") == "" || h.Get("X-RateLimit-Limit-Tokens") != "6000" || h.Get("X-RateLimit-Remaining-Tokens") != "10" ||
		h.Get("X-RateLimit-Reset-Tokens") == "" || h.Get("X-RateLimit-Limit-Requests") != "60" {
		t.Fatalf("headers %v", h)
	}
	if tc.starts.Load() != 0 {
		t.Fatal("a rate-limited request started a workflow")
	}
	// GET /metrics counts the refusal and the decision that made it.
	mrec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(mrec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{
		`sluice_requests_total{outcome="rejected_rate",route=""} 1`,
		`sluice_ratelimit_decisions_total{decision="deny",dimension="tenant"} 1`,
	} {
		if !strings.Contains(mrec.Body.String(), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestLargerThanTheBucketIs413(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		limitedConfig(c)
		c.Limits.Tiers["standard"] = policy.Tier{Weight: 3, Tenant: policy.Rate{TokensPerMinute: 1000}}
	})
	rec := post(srv, `{"query":"hello","max_tokens":1000}`)
	assertJSONError(t, rec, 413, "request_too_large")
	if tc.starts.Load() != 0 {
		t.Fatal("started")
	}
	// The bucket was not charged: a small request still passes the limiter
	// (and reaches the start, which this test's client refuses).
	rec = post(srv, `{"query":"hello","max_tokens":1}`)
	assertJSONError(t, rec, 503, "unavailable")
}

// A request whose start fails gets its whole reservation back.
func TestFailedStartRefunds(t *testing.T) {
	srv, _, _ := newTestServer(t, limitedConfig)
	for i := 0; i < 5; i++ {
		rec := post(srv, `{"query":"hello","max_tokens":1000}`)
		assertJSONError(t, rec, 503, "unavailable")
		if got := rec.Header().Get("X-RateLimit-Remaining-Tokens"); i == 0 && got == "6000" {
			t.Fatal("the reservation was not charged before the start")
		}
	}
	// Five ~1,100-token requests would have drained 6000 without refunds.
	drain := door.RatesOf(srv.policy.Current().Limits.Tiers["standard"]).Buckets(limiter.Caller{Tenant: "acme"}, 5900)
	if d, _ := limiterOf(srv).Reserve(context.Background(), "probe", drain); d.Status != limiter.Allowed {
		t.Fatalf("bucket not refunded: %+v", d)
	}
}

// A tier's output cap bounds max_tokens, and so the reservation.
func TestTierCapsMaxTokens(t *testing.T) {
	srv, _, _ := newTestServer(t, func(c *config.Config) {
		c.Auth.APIKeys[0].Tier = "free"
		c.Limits.Tiers["free"] = policy.Tier{Weight: 2, MaxOutputTokens: 512, Tenant: policy.Rate{TokensPerMinute: 100000}}
	})
	rec := post(srv, `{"query":"hello","max_tokens":2000}`)
	bound := srv.prompts.BoundBeforeRetrieval("hello", srv.cfg.Retrieval.TopK, srv.cfg.Retrieval.ChunkTokens)
	want := strconv.Itoa(100000 - bound - 512)
	if got := rec.Header().Get("X-RateLimit-Remaining-Tokens"); got != want {
		t.Fatalf("remaining after a capped request %s, want %s (charged 512 output tokens, not 2000)", got, want)
	}
}

// A full queue, or a tenant's full share of it, is refused at the door
// with 503 + Retry-After, before any reservation or workflow.
func TestFullQueueIs503AtTheDoor(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.Auth.APIKeys[0].Tier = "standard"
		c.Limits.Tiers["standard"] = policy.Tier{Weight: 3, MaxQueuePerTenant: 2}
	})
	ctx := context.Background()
	// The short pool's single permit is taken; acme already has 2 waiting.
	for i, tenant := range []string{"other", "acme", "acme"} {
		if _, err := srv.gate.Enqueue(ctx, "short", admission.Request{ID: fmt.Sprint("w", i), Tenant: tenant, Weight: 1}); err != nil {
			t.Fatal(err)
		}
	}
	rec := post(srv, `{"query":"hello","max_tokens":8}`)
	assertJSONError(t, rec, 503, "tenant_queue_full")
	if rec.Header().Get("Retry-After") == "" || rec.Header().Get("X-RateLimit-Limit-Tokens") != "" {
		t.Fatalf("headers %v: want Retry-After and no reservation", rec.Header())
	}
	if tc.starts.Load() != 0 {
		t.Fatal("started")
	}
}

// With every start slot taken and no waiting room, a request is refused
// at once with 503.
func TestStartsInFlightAreBounded(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) { c.API.MaxStartsInFlight, c.API.WaitingRoom = 1, 0 })
	tc.hold, tc.holding = make(chan struct{}), make(chan struct{}, 1)
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- post(srv, `{"query":"hello","max_tokens":8}`) }()
	<-tc.holding // the first start is in flight
	rec := post(srv, `{"query":"hello","max_tokens":8}`)
	assertJSONError(t, rec, 503, "busy")
	if rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q", rec.Header().Get("Retry-After"))
	}
	close(tc.hold)
	<-first
	if tc.starts.Load() != 1 {
		t.Fatalf("%d starts, want 1", tc.starts.Load())
	}
	// The slot is free again.
	tc.hold = nil
	assertJSONError(t, post(srv, `{"query":"hello","max_tokens":8}`), 503, "unavailable")
}

// With every start slot taken, a request waits in the door's waiting
// room: its stream gets accepted and queue events at once, and its
// workflow starts when a slot is free.
func TestWaitingRoomStartsWhenASlotIsFree(t *testing.T) {
	srv, tc, rdb := newTestServer(t, func(c *config.Config) { c.API.MaxStartsInFlight = 1 })
	runHub(t, srv)
	tc.hold, tc.holding = make(chan struct{}), make(chan struct{}, 2)
	go func() { post(srv, `{"query":"hello","max_tokens":8}`) }()
	<-tc.holding // the first start is in flight
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- post(srv, `{"query":"hello","max_tokens":8}`) }()
	waitFor(t, "the second request in the waiting room", func() bool { return srv.door.Room().Waiting == 1 })
	// It enters the room before its stream opens; a slot freed before
	// then starts it on the spot (and its failed start is a plain 503).
	// Its first queue event says it waits with its stream open.
	waitFor(t, "the waiter's queue event", func() bool { return hasEventOfType(rdb, srv, events.TypeQueue) })
	if tc.starts.Load() != 1 {
		t.Fatalf("%d starts while the slot was taken, want 1", tc.starts.Load())
	}
	close(tc.hold)
	rec := <-second
	if tc.starts.Load() != 2 {
		t.Fatalf("%d starts, want 2: the waiter never started", tc.starts.Load())
	}
	body := rec.Body.String()
	if rec.Code != 200 || !strings.Contains(body, "event: accepted") || !strings.Contains(body, "event: queue") {
		t.Fatalf("status %d, body %q: want an SSE stream with accepted and queue events", rec.Code, body)
	}
	// The test client refuses every start: the waiter's stream ends with
	// an error event rather than hanging.
	if !strings.Contains(body, "event: error") {
		t.Fatalf("body %q: a failed start must end the stream", body)
	}
}

// DELETE reaches a request still waiting at the door (it has no workflow
// to signal yet): its stream ends with a cancel, and it never starts.
func TestDeleteCancelsARequestAtTheDoor(t *testing.T) {
	srv, tc, rdb := newTestServer(t, func(c *config.Config) { c.API.MaxStartsInFlight = 1 })
	runHub(t, srv)
	tc.hold, tc.holding = make(chan struct{}), make(chan struct{}, 1)
	defer close(tc.hold)
	go func() { post(srv, `{"query":"hello","max_tokens":8}`) }()
	<-tc.holding
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- post(srv, `{"query":"hello","max_tokens":8}`) }()
	waitFor(t, "the second request in the waiting room", func() bool { return srv.door.Room().Waiting == 1 })
	tc.mu.Lock()
	first := tc.inputs[0].RequestID
	tc.mu.Unlock()
	// It enters the room before its accepted event is written.
	var keys []string
	waitFor(t, "both requests' event streams", func() bool {
		keys, _ = rdb.Keys(context.Background(), srv.events.StreamPattern()).Result()
		return len(keys) == 2
	})
	id, _ := srv.events.RequestID(keys[0])
	if id == first {
		id, _ = srv.events.RequestID(keys[1])
	}
	if rec := admin(srv, "DELETE", "/v1/requests/"+id, "k-acme", ""); rec.Code != http.StatusAccepted {
		t.Fatalf("DELETE: %d %s", rec.Code, rec.Body)
	}
	body := (<-second).Body.String()
	if !strings.Contains(body, "event: error") || !strings.Contains(body, `"reason":"cancelled"`) {
		t.Fatalf("body %q: want a cancel", body)
	}
	if tc.starts.Load() != 1 {
		t.Fatalf("%d starts, want 1: the cancelled request started", tc.starts.Load())
	}
}

// A request whose max wait runs out in the waiting room is rejected with
// queue_timeout and a Retry-After; its charge is given back.
func TestWaitingRoomTimesOut(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.API.MaxStartsInFlight = 1
		vip := c.Limits.Tiers["vip"]
		vip.MaxWait = time.Second
		c.Limits.Tiers["vip"] = vip
	})
	runHub(t, srv)
	tc.hold, tc.holding = make(chan struct{}), make(chan struct{}, 1)
	defer close(tc.hold)
	go func() { post(srv, `{"query":"hello","max_tokens":8}`) }()
	<-tc.holding
	start := time.Now()
	rec := post(srv, `{"query":"hello","max_tokens":8}`)
	body := rec.Body.String()
	if !strings.Contains(body, "event: rejected") || !strings.Contains(body, `"reason":"queue_timeout"`) || !strings.Contains(body, `"retry_after_s":`) {
		t.Fatalf("body %q: want a queue_timeout rejection with retry_after_s", body)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("rejected after %v, before its max wait", waited)
	}
	if tc.starts.Load() != 1 {
		t.Fatalf("%d starts, want 1", tc.starts.Load())
	}
}

// While its pool's queue holds a request per permit, a new request waits
// at the door, costing Temporal nothing, and starts once the queue is
// shorter.
func TestWaitingRoomHoldsStartsWhileThePoolQueueIsLong(t *testing.T) {
	srv, tc, _ := newTestServer(t, func(c *config.Config) { c.Pools.Short.MaxConcurrency = 1 })
	runHub(t, srv)
	ctx := context.Background()
	// The queued entry is the caller's own tenant's, ahead of it in the
	// fair order: the request may not pass the room (another tenant's
	// would, door.passes).
	for _, id := range []string{"holder", "queued"} {
		if _, err := srv.gate.Enqueue(ctx, "short", admission.Request{ID: id, Tenant: "acme", Weight: 1}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(srv, `{"query":"hello","max_tokens":8}`) }()
	waitFor(t, "the request in the waiting room", func() bool { return srv.door.Room().Waiting == 1 })
	time.Sleep(100 * time.Millisecond)
	if tc.starts.Load() != 0 {
		t.Fatal("started while its pool's queue was full")
	}
	if _, err := srv.gate.Release(ctx, "short", "queued"); err != nil {
		t.Fatal(err)
	}
	<-done
	if tc.starts.Load() != 1 {
		t.Fatalf("%d starts after the queue shortened, want 1", tc.starts.Load())
	}
}

// runHub runs the server's event hub, for tests that read streams.
func runHub(t *testing.T, srv *Server) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = hubOf(srv).Run(ctx) }()
}

// hasEventOfType reports whether any request's event stream holds an
// event of type typ.
func hasEventOfType(rdb *redis.Client, srv *Server, typ string) bool {
	ctx := context.Background()
	keys, _ := rdb.Keys(ctx, srv.events.StreamPattern()).Result()
	for _, k := range keys {
		msgs, _ := rdb.XRange(ctx, k, "-", "+").Result()
		for _, m := range msgs {
			if m.Values["t"] == typ {
				return true
			}
		}
	}
	return false
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func admin(srv *Server, method, path, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}

func TestAdminRoutesNeedTheAdminKey(t *testing.T) {
	off, _, _ := newTestServer(t, nil)
	assertJSONError(t, admin(off, "GET", "/v1/admin/limits", "", ""), 404, "not_found")
	srv, _, _ := newTestServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	// A valid key without the admin scope is known, and refused.
	assertJSONError(t, admin(srv, "GET", "/v1/admin/limits", "k-acme", ""), 403, "forbidden")
	assertJSONError(t, admin(srv, "GET", "/v1/admin/queue", "", ""), 401, "unauthorized")
	if rec := admin(srv, "GET", "/v1/admin/queue", "root", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"pool":"short"`) {
		t.Fatalf("queue view %d %s", rec.Code, rec.Body)
	}
}

// A policy change through the admin API governs the next request.
func TestAdminLimitsChangeTakesEffect(t *testing.T) {
	srv, _, _ := newTestServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" })
	rec := admin(srv, "GET", "/v1/admin/limits", "root", "")
	if rec.Code != 200 {
		t.Fatalf("get limits %d %s", rec.Code, rec.Body)
	}
	var doc map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &doc)
	tiers := doc["tiers"].(map[string]any)
	vip := tiers["vip"].(map[string]any)
	vip["tenant"] = map[string]any{"tokens_per_minute": 100}
	body, _ := json.Marshal(doc)
	rec = admin(srv, "PUT", "/v1/admin/limits", "root", string(body))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"version":1`) {
		t.Fatalf("put limits %d %s", rec.Code, rec.Body)
	}
	// k-acme is a vip tenant: its bucket now holds 100 tokens.
	assertJSONError(t, post(srv, `{"query":"hello","max_tokens":8}`), 413, "request_too_large")

	bad := strings.Replace(string(body), `"weight":5`, `"weight":0`, 1)
	assertJSONError(t, admin(srv, "PUT", "/v1/admin/limits", "root", bad), 400, "invalid_policy")
}

func TestHealthz(t *testing.T) {
	srv, _, _ := newTestServer(t, nil)
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	var body map[string]string
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body["status"] != "ok" ||
		body["version"] != version.Version || body["commit"] != version.Get().Commit || body["commit"] == "" {
		t.Fatalf("healthz %d %s, want ok, version %s and the commit", rec.Code, rec.Body, version.Version)
	}
}

func assertJSONError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q", ct)
	}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", rec.Body, err)
	}
	if body.Error.Code != code || body.Error.Message == "" {
		t.Fatalf("error %+v, want code %s with a message", body.Error, code)
	}
}

// A pool's max_wait applies in that pool unless the tier sets its own.
func TestChatSettingsMaxWait(t *testing.T) {
	cfg := config.Default()
	cfg.Pools.Long.MaxWait = 2 * time.Minute
	plain := door.ChatSettings(cfg, policy.Tier{Weight: 1})
	if plain.MaxWait != cfg.Admission.MaxWait || len(plain.MaxWaitByPool) != 1 || plain.MaxWaitByPool["long"] != 2*time.Minute {
		t.Fatalf("settings %+v", plain)
	}
	vip := door.ChatSettings(cfg, policy.Tier{Weight: 5, MaxWait: time.Minute})
	if vip.MaxWait != time.Minute || vip.MaxWaitByPool != nil {
		t.Fatalf("a tier's max_wait must win: %+v", vip)
	}
}

// Only allow-listed kbs use the answer cache, and never a request in a
// session (its answer depends on the conversation).
func TestAnswerCacheOnlyForAllowListedKBs(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		allow      []string
		want       bool
	}{
		{"listed", `{"query":"hello"}`, []string{"sluice-docs"}, true},
		{"listed, in a session", `{"query":"hello","session_id":"s1"}`, []string{"sluice-docs"}, false},
		{"not listed", `{"query":"hello"}`, []string{"acme/other"}, false},
		{"off", `{"query":"hello"}`, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, tc2, _ := newTestServer(t, func(c *config.Config) { c.AnswerCache.KBs = tc.allow })
			req := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer k-acme")
			req.Header.Set("Content-Type", "application/json")
			srv.Handler().ServeHTTP(httptest.NewRecorder(), req)
			tc2.mu.Lock()
			defer tc2.mu.Unlock()
			if len(tc2.inputs) != 1 {
				t.Fatalf("%d workflow starts", len(tc2.inputs))
			}
			if got := tc2.inputs[0].Settings.AnswerCache; got != tc.want {
				t.Fatalf("AnswerCache = %v, want %v", got, tc.want)
			}
		})
	}
}

// While the healer throttles long requests, a request routed to the long
// pool is charged the policy's factor times its tokens at the door, so a
// tenant's long requests hit 429 sooner; short ones are charged as before.
func TestLongCostFactorChargesLongRequestsMore(t *testing.T) {
	srv, _, _ := newTestServer(t, func(c *config.Config) {
		limitedConfig(c)
		c.Auth.AdminKey = "root"
		// Every prompt with its context bound is long.
		c.Routing.ShortThresholdTokens = 10
	})
	const body = `{"query":"why do long prompts stretch the tail?","max_tokens":500}`
	charged := func(rec *httptest.ResponseRecorder) int {
		t.Helper()
		// The start is refused by the test client and the charge given
		// back; the header shows what the door took.
		assertJSONError(t, rec, 503, "unavailable")
		left, err := strconv.Atoi(rec.Header().Get("X-RateLimit-Remaining-Tokens"))
		if err != nil {
			t.Fatalf("remaining tokens header %q", rec.Header().Get("X-RateLimit-Remaining-Tokens"))
		}
		return 6000 - left
	}
	plain := charged(post(srv, body))

	rec := admin(srv, "GET", "/v1/admin/limits", "root", "")
	var doc map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &doc)
	if _, ok := doc["long_cost_factor"]; ok {
		t.Fatalf("configured policy shows a long cost factor: %s", rec.Body)
	}
	doc["long_cost_factor"] = 2
	raw, _ := json.Marshal(doc)
	if rec := admin(srv, "PUT", "/v1/admin/limits", "root", string(raw)); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"long_cost_factor":2`) {
		t.Fatalf("put limits %d %s", rec.Code, rec.Body)
	}
	if got := charged(post(srv, body)); got != 2*plain {
		t.Fatalf("long request charged %d with factor 2, %d without", got, plain)
	}
	// With room for one charge but not two, the long request is refused.
	drain := door.RatesOf(srv.policy.Current().Limits.Tiers["standard"]).Buckets(limiter.Caller{Tenant: "acme"}, float64(6000-plain*3/2))
	if d, err := limiterOf(srv).Reserve(context.Background(), "other", drain); err != nil || d.Status != limiter.Allowed {
		t.Fatalf("drain: %+v %v", d, err)
	}
	assertJSONError(t, post(srv, body), 429, "rate_limited")

	doc["long_cost_factor"] = 20
	raw, _ = json.Marshal(doc)
	assertJSONError(t, admin(srv, "PUT", "/v1/admin/limits", "root", string(raw)), 400, "invalid_policy")
}

// Requests routed short are charged as before whatever the factor.
func TestLongCostFactorLeavesShortRequests(t *testing.T) {
	srv, _, _ := newTestServer(t, func(c *config.Config) { limitedConfig(c) })
	const body = `{"query":"hi","max_tokens":100}`
	before := post(srv, body).Header().Get("X-RateLimit-Remaining-Tokens")
	if _, err := srv.policy.Update(context.Background(), func(p *policy.Policy) bool { p.LongCostFactor = 5; return true }); err != nil {
		t.Fatal(err)
	}
	if after := post(srv, body).Header().Get("X-RateLimit-Remaining-Tokens"); after != before || before == "" {
		t.Fatalf("short request left %s tokens with factor 5, %s without", after, before)
	}
}

// The door routes by the rule and the inputs admission uses: the prompt's
// bound plus the session turns the prompt will carry. A query that is
// short alone goes long when its session's history pushes it over the
// threshold, and the workflow is started with that pool.
func TestDoorRoutesWithTheSessionHistory(t *testing.T) {
	def := config.Default()
	tok, err := tokens.For(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	prompts := prompt.NewBuilder(def.LLM.SystemPrompt, tok)
	bound := prompts.BoundForQueryTokens(prompts.QueryTokens("hello"), def.Retrieval.TopK, def.Retrieval.ChunkTokens)
	srv, tc, _ := newTestServerWith(t, func(c *config.Config) { c.Routing.ShortThresholdTokens = bound + 5 }, withSessions(t))
	sessions := srv.sessions
	if err := sessions.Append(context.Background(), session.Owner{Tenant: "acme", User: "acme"}, "s1", session.Turn{
		RequestID: "chat-earlier", Query: "an earlier question", Answer: strings.Repeat("a long earlier answer ", 20),
		Outcome: request.OutcomeDone, At: time.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"query":"hello"}`, `{"query":"hello","session_id":"s1"}`} {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k-acme")
		req.Header.Set("Content-Type", "application/json")
		srv.Handler().ServeHTTP(httptest.NewRecorder(), req)
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if len(tc.inputs) != 2 {
		t.Fatalf("%d workflow starts, want 2", len(tc.inputs))
	}
	if got := tc.inputs[0].Pool; got != request.PoolShort {
		t.Errorf("without a session: pool %q, want short", got)
	}
	if got := tc.inputs[1].Pool; got != request.PoolLong {
		t.Errorf("with a session whose turns push it over the threshold: pool %q, want long", got)
	}
}

// With Redis stalled, a chat request is refused with 503 and Retry-After
// within the door's request timeout, not when Redis answers again.
func TestStalledRedisIs503InBoundedTime(t *testing.T) {
	srv, tc, rdb := newTestServer(t, func(c *config.Config) { c.Redis.RequestTimeout = 300 * time.Millisecond })
	admin := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer admin.Close()
	const stall = 3 * time.Second
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", stall.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
	start := time.Now()
	rec := post(srv, `{"query":"hello","max_tokens":8}`)
	took := time.Since(start)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q, body %s: want 503 with Retry-After", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	if took >= stall {
		t.Fatalf("answered after %v: it waited for Redis to come back", took)
	}
	if tc.starts.Load() != 0 {
		t.Fatal("started a workflow")
	}
	_ = rdb
}

// A start that reports an error while the server did start the workflow
// (its reply was lost) is resolved by id: the client follows the request
// instead of being told it failed while it runs for nobody.
func TestStartWithALostReplyIsFollowed(t *testing.T) {
	srv, tc, _ := newTestServer(t, nil)
	tc.startedAnyway.Store(true)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat", strings.NewReader(`{"query":"hello","max_tokens":8}`))
	req.Header.Set("Authorization", "Bearer k-acme")
	req.Header.Set("Content-Type", "application/json")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req.WithContext(ctx)) // the stream runs until the client leaves
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, type %q, body %s: want the request's event stream", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	if tc.starts.Load() != 1 {
		t.Fatalf("%d starts, want 1", tc.starts.Load())
	}
}

// withSessions gives a test server a session store of the test's own.
func withSessions(t *testing.T) func(*redis.Client, *Options) {
	return func(rdb *redis.Client, o *Options) {
		sessions, err := session.New(rdb, session.Options{KeyPrefix: "t:" + t.Name() + ":", TTL: time.Minute, MaxTurns: 10})
		if err != nil {
			t.Fatal(err)
		}
		o.Sessions = sessions
	}
}

// With metrics.addr set, the public port does not serve /metrics: the app
// serves it on that address instead.
func TestMetricsOffThePublicPort(t *testing.T) {
	for addr, want := range map[string]int{"": http.StatusOK, "127.0.0.1:9090": http.StatusNotFound} {
		srv, _, _ := newTestServer(t, func(c *config.Config) { c.Metrics.Addr = addr })
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != want {
			t.Errorf("metrics.addr %q: GET /metrics on the API's port is %d, want %d", addr, rec.Code, want)
		}
	}
}
