package activities_test

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
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/answercache"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/rerank"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var redisAddr string

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { redisAddr = r.Addr }))
}

var quiet = slog.New(slog.DiscardHandler)

const (
	kbName = "sluice-docs"
	query  = "How does admission control protect an LLM pool from overload?"
)

// knowledgeBase is a kb store holding the built-in corpus, ingested and
// served as app.Build does it: through pkg/ingest, and searched by
// a retrieval.Live.
type knowledgeBase struct {
	store *kbstore.Store
	ing   *ingest.Ingester
	live  *retrieval.Live
}

// newKnowledgeBase ingests the built-in corpus into a store over rdb.
func newKnowledgeBase(rdb *redis.Client, opts kbstore.Options) (*knowledgeBase, error) {
	cfg := config.Default()
	emb := embed.NewLocal(embed.LocalOptions{Dims: cfg.Embedding.Dims})
	store := kbstore.New(rdb, opts)
	ing := &ingest.Ingester{Store: store, Embedder: emb, Chunking: retrieval.ChunkingFor(cfg.Retrieval.ChunkTokens, cfg.Retrieval.ChunkOverlapTokens)}
	builtin, err := retrieval.Builtin(kbName)
	if err != nil {
		return nil, err
	}
	docs := make([]ingest.Document, len(builtin))
	for i, d := range builtin {
		docs[i] = ingest.Document{ID: d.ID, Title: d.Title, Text: d.Text}
	}
	if _, err := ing.Put(context.Background(), kbName, docs); err != nil {
		return nil, err
	}
	live, err := retrieval.NewLive(store, retrieval.LiveOptions{Model: emb.Model(), Logger: quiet})
	if err != nil {
		return nil, err
	}
	return &knowledgeBase{store: store, ing: ing, live: live}, nil
}

// knowledge is the kb the harnesses share, ingested once per test binary
// under a prefix of its own: tests only read it, and its content, hence
// its version, is the same in every run.
var knowledge = sync.OnceValues(func() (*knowledgeBase, error) {
	return newKnowledgeBase(redis.NewClient(&redis.Options{Addr: redisAddr}), kbstore.Options{Prefix: "acts-kb:"})
})

// retiringKnowledge is a knowledge base of the test's own whose replaced
// revisions are gone a millisecond later, for chunk refs that outlive
// their text.
func retiringKnowledge(t *testing.T) *knowledgeBase {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	kb, err := newKnowledgeBase(rdb, kbstore.Options{Prefix: testenv.KeyPrefix(t), Grace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return kb
}

// rewrite replaces the document of a chunk of version, waits out the old
// revision's grace period and catches the index up, as the next request's
// retrieval would: the chunk is then neither in the index nor in the store.
func (kb *knowledgeBase) rewrite(t *testing.T, version int64, chunkID string) {
	t.Helper()
	ctx := context.Background()
	chunks, err := kb.live.Lookup(ctx, kbName, version, []string{chunkID})
	if err != nil {
		t.Fatal(err)
	}
	doc := ingest.Document{ID: chunks[0].DocID, Title: chunks[0].Title, Text: "A rewritten document."}
	if _, err := kb.ing.Put(ctx, kbName, []ingest.Document{doc}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if _, err := kb.live.KBVersion(ctx, kbName); err != nil {
		t.Fatal(err)
	}
}

var counter = sync.OnceValues(func() (*tokens.Counter, error) { return tokens.For(tokens.CL100K) })

// harnessOptions are what tests override; everything else comes from
// config.Default().
type harnessOptions struct {
	// limits default to one permit per pool, so that a second request
	// queues.
	limits         map[string]int
	lease          time.Duration
	maxQueueDepth  int
	shortThreshold int
	// streamer serves both pools.
	streamer llm.Streamer
	// redis, when set, adjusts the harness's Redis client (its Addr is
	// the test binary's server).
	redis func(*redis.Options)
	// kb, when set, replaces the shared knowledge base.
	kb *knowledgeBase
	// holds, when set, hears the gate's permit holds (the worker's
	// metrics).
	holds admission.HoldRecorder
}

// harness is an *activities.Chat wired from real components as
// app.Build wires it, over the test Redis and a key prefix of its
// own.
type harness struct {
	acts     *activities.Chat
	rdb      *redis.Client
	gate     *admission.Gate
	log      *events.Log
	kb       *retrieval.Live
	notifier *fakeNotifier
	prefix   string
}

var runSeq atomic.Int64

func newHarness(t *testing.T, mod func(*harnessOptions)) *harness {
	t.Helper()
	cfg := config.Default()
	opts := harnessOptions{
		limits:         map[string]int{request.PoolShort: 1, request.PoolLong: 1},
		lease:          10 * time.Second,
		maxQueueDepth:  100,
		shortThreshold: cfg.Routing.ShortThresholdTokens,
		streamer:       &fakeLLM{tokens: []string{"ok"}},
	}
	if mod != nil {
		mod(&opts)
	}
	kb := opts.kb
	if kb == nil {
		var err error
		if kb, err = knowledge(); err != nil {
			t.Fatal(err)
		}
	}
	tc, err := counter()
	if err != nil {
		t.Fatal(err)
	}
	// -count=N reruns a test against the same Redis: the sequence keeps
	// the runs' keys apart.
	prefix := fmt.Sprintf("acts:%s:%d:", t.Name(), runSeq.Add(1))
	ro := &redis.Options{Addr: redisAddr}
	if opts.redis != nil {
		opts.redis(ro)
	}
	rdb := redis.NewClient(ro)
	t.Cleanup(func() { _ = rdb.Close() })

	gate, err := admission.New(rdb, admission.Options{
		KeyPrefix:     prefix,
		Lease:         opts.lease,
		WaiterTTL:     time.Minute,
		MaxQueueDepth: opts.maxQueueDepth,
		Limits:        opts.limits,
		Holds:         opts.holds,
	})
	if err != nil {
		t.Fatal(err)
	}
	embedder := embed.NewLocal(embed.LocalOptions{Dims: cfg.Embedding.Dims})
	evlog := events.NewLog(rdb, events.LogOptions{KeyPrefix: prefix, TTL: time.Minute})
	notifier := &fakeNotifier{gone: map[string]bool{}}
	waker, err := admission.NewWaker(context.Background(), rdb, gate)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = waker.Close() })
	sessions, err := session.New(rdb, session.Options{KeyPrefix: prefix, TTL: time.Minute, MaxTurns: cfg.Sessions.MaxTurns})
	if err != nil {
		t.Fatal(err)
	}
	acts := &activities.Chat{
		Redis:    rdb,
		Events:   evlog,
		Gate:     gate,
		Notifier: notifier,
		Waker:    waker,
		Embeddings: embed.NewCache(embedder, rdb, embed.CacheOptions{
			Prefix: prefix, TTL: time.Minute, LRUSize: 100, Logger: quiet,
		}),
		Retriever: cachedRetriever{retrieval.NewCachedRetriever(kb.live, rdb, retrieval.CacheOptions{
			Prefix: prefix, TTL: time.Minute, Version: embedder.Model(),
			DocIndexKey: kb.store.L2DocKey, VersionKey: kb.store.VersionKey, RefsOnly: true,
			Logger: quiet,
		})},
		Chunks:   kb.live,
		Reranker: rerank.NewLexical(rerank.LexicalOptions{}),
		Pools: map[string]activities.Pool{
			request.PoolShort: {Streamer: opts.streamer, Model: "fake", MaxPromptTokens: cfg.Pools.Short.MaxPromptTokens},
			request.PoolLong:  {Streamer: opts.streamer, Model: "fake", MaxPromptTokens: cfg.Pools.Long.MaxPromptTokens},
		},
		Prompts:    prompt.NewBuilder(cfg.LLM.SystemPrompt, tc),
		Sessions:   sessions,
		Answers:    answercache.New(rdb, prefix, time.Minute),
		KBVersions: kb.store,
		Budgets: budget.New(rdb, budget.Options{KeyPrefix: prefix, Prices: budget.Prices{
			Models: map[string]budget.Price{"fake": {Input: 1, Output: 3}, "fallback": {Input: 2, Output: 5}},
			Pools:  map[string]budget.Price{request.PoolShort: {Input: 1, Output: 3}, request.PoolLong: {Input: 1, Output: 3}},
		}}),
		Logger: quiet,
		Options: activities.Options{
			ShortThreshold:   opts.shortThreshold,
			TopK:             cfg.Retrieval.TopK,
			ChunkTokens:      cfg.Retrieval.ChunkTokens,
			StopFlagTTL:      time.Minute,
			TruncationNotice: cfg.LLM.TruncationNotice,
		},
	}
	acts.Returner = &holdings.Returner{Gate: acts.Gate, Notifier: acts.Notifier, Limiter: acts.Limiter, Budgets: acts.Budgets, Logger: quiet}
	return &harness{acts: acts, rdb: rdb, gate: gate, log: evlog, kb: kb.live, notifier: notifier, prefix: prefix}
}

// cachedRetriever adapts the L2 cache to the activities' interface, as the
// worker's adapter does.
type cachedRetriever struct{ c *retrieval.CachedRetriever }

func (r cachedRetriever) Retrieve(ctx context.Context, q retrieval.Query) (retrieval.Result, bool, error) {
	return r.c.Get(ctx, q)
}

// local runs fn as the workflow runs it, as a local activity: a local
// activity's error reaches the SDK's retry decision unconverted. It does
// not fail t, so that a fake may call it from inside another activity.
func local[T any](t *testing.T, h *harness, fn, in any, interceptors ...interceptor.WorkerInterceptor) (T, error) {
	t.Helper()
	var out T
	env := (&testsuite.WorkflowTestSuite{}).NewTestActivityEnvironment()
	env.SetWorkerOptions(worker.Options{Interceptors: interceptors})
	env.RegisterActivity(h.acts)
	val, err := env.ExecuteLocalActivity(fn, in)
	if err != nil {
		return out, err
	}
	if val != nil && val.HasValue() {
		if err := val.Get(&out); err != nil {
			return out, fmt.Errorf("decode result: %w", err)
		}
	}
	return out, nil
}

// stream runs StreamLLM as the workflow does, as a regular activity, with
// heartbeat details from an earlier attempt if details is not nil.
func stream(t *testing.T, h *harness, in activities.LLMInput, details any) (activities.LLMOutput, error) {
	t.Helper()
	// A stream runs with its permit held, as after admission (Enqueue is
	// idempotent: a request that holds one keeps it). An unknown pool is
	// left to the activity to refuse.
	if slices.Contains(h.gate.Pools(), in.Pool) {
		if r := h.enqueue(t, in.Pool, in.RequestID); r.Status != admission.Granted {
			t.Fatalf("stream %s: no permit free in pool %s: %+v", in.RequestID, in.Pool, r)
		}
	}
	return streamAsIs(t, h, in, details)
}

// streamAsIs runs StreamLLM without taking a permit first.
func streamAsIs(t *testing.T, h *harness, in activities.LLMInput, details any) (activities.LLMOutput, error) {
	t.Helper()
	var out activities.LLMOutput
	env := (&testsuite.WorkflowTestSuite{}).NewTestActivityEnvironment()
	env.RegisterActivity(h.acts)
	if details != nil {
		env.SetHeartbeatDetails(details)
	}
	val, err := env.ExecuteActivity(h.acts.StreamLLM, in)
	if err != nil {
		return out, err
	}
	if err := val.Get(&out); err != nil {
		return out, fmt.Errorf("decode result: %w", err)
	}
	return out, nil
}

func mustLocal[T any](t *testing.T, h *harness, fn, in any) T {
	t.Helper()
	out, err := local[T](t, h, fn, in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// appError returns the outermost application error in err's chain, which
// is the one Temporal's retry policy and the workflow look at.
func appError(t *testing.T, err error) *temporal.ApplicationError {
	t.Helper()
	if err == nil {
		t.Fatal("got no error")
	}
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) {
		t.Fatalf("error %v (%T) holds no application error", err, err)
	}
	return appErr
}

func wantAppError(t *testing.T, err error, typ string, nonRetryable bool) {
	t.Helper()
	appErr := appError(t, err)
	if appErr.Type() != typ || appErr.NonRetryable() != nonRetryable {
		t.Fatalf("application error type %q, non-retryable %v, want %q, %v: %v",
			appErr.Type(), appErr.NonRetryable(), typ, nonRetryable, err)
	}
}

func (h *harness) events(t *testing.T, requestID string) []events.Event {
	t.Helper()
	evs, err := h.log.After(context.Background(), requestID, "0", 10000)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func ofType(evs []events.Event, typ string) []events.Event {
	var out []events.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

func decode[T any](t *testing.T, ev events.Event) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(ev.Data, &v); err != nil {
		t.Fatalf("decode %s event %s: %v", ev.Type, ev.Data, err)
	}
	return v
}

func (h *harness) stats(t *testing.T, pool string) admission.Stats {
	t.Helper()
	s, err := h.gate.Stats(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// permitExpiry is the lease expiry (Redis ms) of requestID's permit, or
// ok=false if it holds none. The key layout is pkg/admission's.
func (h *harness) permitExpiry(t *testing.T, pool, requestID string) (float64, bool) {
	t.Helper()
	score, err := h.rdb.ZScore(context.Background(), h.prefix+"adm:{"+pool+"}:permits", requestID).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return score, true
}

func (h *harness) enqueue(t *testing.T, pool, requestID string) admission.Result {
	t.Helper()
	res, err := h.gate.Enqueue(context.Background(), pool, admission.Request{ID: requestID, Tenant: "t", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// admit admits requestID through the Admit activity and fails unless
// the outcome is want ("granted" or "queued").
func (h *harness) admit(t *testing.T, requestID, want string) activities.AdmitOutput {
	t.Helper()
	out := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{RequestID: requestID, Query: query})
	got := "queued"
	if out.Granted {
		got = "granted"
	}
	if out.Full {
		got = "full"
	}
	if got != want {
		t.Fatalf("admit %s: %s (%+v), want %s", requestID, got, out, want)
	}
	return out
}

// retrieveContext retrieves and reranks query's context as the workflow does
// before the LLM stage.
func (h *harness) retrieveContext(t *testing.T, requestID string, candidates, k int) (int64, []activities.ChunkRef) {
	t.Helper()
	ret := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{
		RequestID: requestID, KB: kbName, Query: query, K: candidates,
	})
	rr := mustLocal[activities.RerankOutput](t, h, h.acts.Rerank, activities.RerankInput{
		RequestID: requestID, KB: kbName, KBVersion: ret.KBVersion, Query: query, Hits: ret.Hits, K: k,
	})
	return ret.KBVersion, rr.Hits
}

// fakeNotifier records whom admission woke; waiters in gone are gone, as
// the notifier of a finished workflow says.
type fakeNotifier struct {
	mu    sync.Mutex
	calls []string
	gone  map[string]bool
}

func (n *fakeNotifier) NotifyGranted(_ context.Context, pool, requestID string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = append(n.calls, pool+"/"+requestID)
	return n.gone[requestID], nil
}

func (n *fakeNotifier) setGone(requestID string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gone[requestID] = true
}

func (n *fakeNotifier) woken() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.calls)
}

// fakeLLM streams scripted tokens.
type fakeLLM struct {
	tokens []string
	// deltas, if set, are streamed instead of tokens.
	deltas []llm.Delta
	// delay is waited before every token.
	delay time.Duration
	// err, if set, is returned after failAfter tokens.
	err       error
	failAfter int
	// usage is reported when set.
	usage *llm.Usage
	// onToken runs after each delivered token; true ends the answer
	// there, as a model that stops.
	onToken func(i int) bool
	// finish is the finish reason reported ("stop" if empty).
	finish string

	mu   sync.Mutex
	reqs []llm.Request
}

func (f *fakeLLM) Stream(ctx context.Context, req llm.Request, onDelta func(llm.Delta) error) (llm.Result, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	res := llm.Result{Endpoint: "fake", FinishReason: cmp.Or(f.finish, "stop")}
	if f.deltas != nil {
		for _, d := range f.deltas {
			res.Chunks++
			res.Model = cmp.Or(res.Model, d.Model)
			if err := onDelta(d); err != nil {
				return res, err
			}
		}
		return res, nil
	}
	for i, tok := range f.tokens {
		if f.err != nil && i == f.failAfter {
			return res, f.err
		}
		if f.delay > 0 {
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(f.delay):
			}
		}
		res.Chunks++
		if err := onDelta(llm.Delta{Text: tok}); err != nil {
			return res, err
		}
		if f.onToken != nil && f.onToken(i) {
			break
		}
	}
	if f.err != nil && f.failAfter >= len(f.tokens) {
		return res, f.err
	}
	if f.usage != nil {
		res.Usage, res.UsageReported = *f.usage, true
	}
	return res, nil
}

func (f *fakeLLM) requests() []llm.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

func words(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(" w%d", i)
	}
	return out
}
