package activities_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/answercache"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/llmsim"
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

// knowledge is the built-in kb, loaded once per test binary the way
// worker/kb.go loads it: it is immutable, and its version lives under a
// prefix of its own so that every run of a test sees the same version.
var knowledge = sync.OnceValues(func() (*retrieval.Hybrid, error) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	docs, err := retrieval.Builtin(kbName)
	if err != nil {
		return nil, err
	}
	cfg := config.Default()
	kb, err := retrieval.NewKB(context.Background(), kbName, docs, retrieval.KBOptions{
		Embedder: embed.NewLocal(embed.LocalOptions{Dims: cfg.Embedding.Dims}),
		Chunking: retrieval.ChunkOptions{MaxWords: max(cfg.Retrieval.ChunkTokens*3/4, 10)},
		Versions: retrieval.NewVersions(rdb, "acts-kb:"),
		Logger:   quiet,
	})
	if err != nil {
		return nil, err
	}
	return retrieval.NewHybrid(retrieval.HybridOptions{}, kb)
})

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
}

// harness is an *activities.Chat wired from real components as
// worker/runtime.go wires it, over the test Redis and a key prefix of its
// own.
type harness struct {
	acts     *activities.Chat
	rdb      *redis.Client
	gate     *admission.Gate
	log      *events.Log
	kb       *retrieval.Hybrid
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
	kb, err := knowledge()
	if err != nil {
		t.Fatal(err)
	}
	tc, err := counter()
	if err != nil {
		t.Fatal(err)
	}
	// -count=N reruns a test against the same Redis: the sequence keeps
	// the runs' keys apart.
	prefix := fmt.Sprintf("acts:%s:%d:", t.Name(), runSeq.Add(1))
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })

	gate, err := admission.New(rdb, admission.Options{
		KeyPrefix:     prefix,
		Lease:         opts.lease,
		WaiterTTL:     time.Minute,
		MaxQueueDepth: opts.maxQueueDepth,
		Limits:        opts.limits,
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
		Retriever: cachedRetriever{retrieval.NewCachedRetriever(kb, rdb, retrieval.CacheOptions{
			Prefix: prefix, TTL: time.Minute, Version: embedder.Model(), Logger: quiet,
		})},
		Chunks:   kb,
		Reranker: rerank.NewLexical(rerank.LexicalOptions{}),
		Pools: map[string]activities.Pool{
			request.PoolShort: {Streamer: opts.streamer, Model: "fake", MaxPromptTokens: cfg.Pools.Short.MaxPromptTokens},
			request.PoolLong:  {Streamer: opts.streamer, Model: "fake", MaxPromptTokens: cfg.Pools.Long.MaxPromptTokens},
		},
		Prompts:    prompt.NewBuilder(cfg.LLM.SystemPrompt, tc),
		Sessions:   sessions,
		Answers:    answercache.New(rdb, prefix, time.Minute),
		KBVersions: hybridVersions{kb},
		Logger:     quiet,
		Options: activities.Options{
			KeyPrefix:        prefix,
			ShortThreshold:   opts.shortThreshold,
			TopK:             cfg.Retrieval.TopK,
			ChunkTokens:      cfg.Retrieval.ChunkTokens,
			StopFlagTTL:      time.Minute,
			TruncationNotice: cfg.LLM.TruncationNotice,
		},
	}
	return &harness{acts: acts, rdb: rdb, gate: gate, log: evlog, kb: kb, notifier: notifier, prefix: prefix}
}

// hybridVersions reads kb versions from the static kb, as the worker
// reads them from the kb store.
type hybridVersions struct{ h *retrieval.Hybrid }

func (v hybridVersions) Version(ctx context.Context, kb string) (int64, error) {
	return v.h.KBVersion(ctx, kb)
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
func local[T any](t *testing.T, h *harness, fn, in any) (T, error) {
	t.Helper()
	var out T
	env := (&testsuite.WorkflowTestSuite{}).NewTestActivityEnvironment()
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

// fakeNotifier records whom admission woke; waiters in gone answer
// admission.ErrWaiterGone, as the notifier of a finished workflow does.
type fakeNotifier struct {
	mu    sync.Mutex
	calls []string
	gone  map[string]bool
}

func (n *fakeNotifier) NotifyGranted(_ context.Context, pool, requestID string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = append(n.calls, pool+"/"+requestID)
	if n.gone[requestID] {
		return admission.ErrWaiterGone
	}
	return nil
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

func (f *fakeLLM) Stream(ctx context.Context, req llm.Request, onDelta func(string) error) (llm.Result, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	res := llm.Result{Endpoint: "fake", FinishReason: cmp.Or(f.finish, "stop")}
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
		if err := onDelta(tok); err != nil {
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

func TestEmbedQueryMissThenMemoryHit(t *testing.T) {
	h := newHarness(t, nil)
	first := mustLocal[activities.EmbedOutput](t, h, h.acts.EmbedQuery, activities.EmbedInput{RequestID: "r1", Query: query})
	if first.Cache != embed.TierMiss || first.Dims != 256 {
		t.Fatalf("first embed: %+v, want a miss of 256 dims (the local default)", first)
	}
	second := mustLocal[activities.EmbedOutput](t, h, h.acts.EmbedQuery, activities.EmbedInput{RequestID: "r2", Query: "  " + strings.ToUpper(query)})
	if second.Cache != embed.TierMemory || second.Dims != first.Dims {
		t.Fatalf("second embed of the same normalised query: %+v, want a memory hit", second)
	}
	for _, id := range []string{"r1", "r2"} {
		evs := h.events(t, id)
		if len(evs) != 1 || evs[0].Type != events.TypeStage {
			t.Fatalf("%s events: %+v, want one stage event", id, evs)
		}
		if st := decode[events.Stage](t, evs[0]); st.Stage != "embed" {
			t.Fatalf("%s stage event: %+v, want embed", id, st)
		}
	}
}

func TestAdmitRoutesByPromptBound(t *testing.T) {
	cfg := config.Default()
	for _, tc := range []struct {
		name      string
		threshold int
		want      string
	}{
		{"default threshold", cfg.Routing.ShortThresholdTokens, request.PoolShort},
		{"tiny threshold", 10, request.PoolLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOptions) { o.shortThreshold = tc.threshold })
			out := h.admit(t, "r1", "granted")
			if out.Pool != tc.want {
				t.Fatalf("pool %q, want %q (bound %d, threshold %d)", out.Pool, tc.want, out.EstimatedPromptTokens, tc.threshold)
			}
			want := h.acts.Prompts.BoundBeforeRetrieval(query, cfg.Retrieval.TopK, cfg.Retrieval.ChunkTokens)
			if out.EstimatedPromptTokens != want {
				t.Fatalf("estimated prompt tokens %d, want %d", out.EstimatedPromptTokens, want)
			}
			if s := h.stats(t, tc.want); s.InUse != 1 {
				t.Fatalf("%s pool: %d permits in use, want 1", tc.want, s.InUse)
			}
		})
	}
}

func TestAdmitGrantsWhenFree(t *testing.T) {
	h := newHarness(t, nil)
	out := h.admit(t, "r1", "granted")
	if out.Pool != request.PoolShort || out.Position != 0 || out.Full {
		t.Fatalf("admit: %+v, want granted in short", out)
	}
	evs := h.events(t, "r1")
	if len(evs) != 1 || evs[0].Type != events.TypeStage {
		t.Fatalf("events: %+v, want one stage event", evs)
	}
	if st := decode[events.Stage](t, evs[0]); st.Stage != "admission" || st.Pool != request.PoolShort {
		t.Fatalf("stage event %+v, want admission in short", st)
	}
	if got := h.notifier.woken(); len(got) != 0 {
		t.Fatalf("woke %v, want nobody", got)
	}
}

func TestAdmitQueuesAndRechecksQuietly(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	out := h.admit(t, "waiter", "queued")
	if out.Position != 1 || out.Seq <= 0 || out.Pool != request.PoolShort {
		t.Fatalf("admit: %+v, want queued first in short with a seq", out)
	}
	evs := h.events(t, "waiter")
	if len(evs) != 2 || evs[0].Type != events.TypeStage || evs[1].Type != events.TypeQueue {
		t.Fatalf("events: %+v, want stage then queue", evs)
	}
	if q := decode[events.Queue](t, evs[1]); q.Position != 1 || q.Pool != request.PoolShort || q.EstimatedWaitMs != out.EstimatedWaitMs {
		t.Fatalf("queue event %+v, want position 1 in short, wait %d", q, out.EstimatedWaitMs)
	}

	re := mustLocal[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "waiter", Pool: out.Pool, Seq: out.Seq, Recheck: true,
	})
	if re.Granted || re.Full || re.Position != 1 || re.Seq != out.Seq || re.Pool != request.PoolShort {
		t.Fatalf("re-check: %+v, want still queued first with seq %d", re, out.Seq)
	}
	if n := len(h.events(t, "waiter")); n != 2 {
		t.Fatalf("re-check wrote events: %d now, want 2", n)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want 1 in use and 1 waiting", s)
	}
}

func TestAdmitFullQueue(t *testing.T) {
	h := newHarness(t, func(o *harnessOptions) { o.maxQueueDepth = 1 })
	h.admit(t, "holder", "granted")
	h.admit(t, "waiter", "queued")
	out := h.admit(t, "late", "full")
	if out.Granted || out.Position != 0 {
		t.Fatalf("admit: %+v, want full", out)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want the full request neither holding nor queued", s)
	}
	if q := ofType(h.events(t, "late"), events.TypeQueue); len(q) != 0 {
		t.Fatalf("queue events for a request that was not queued: %+v", q)
	}
}

func TestAdmitAfterReleaseIsGone(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "r1", "granted")
	if err := func() error {
		_, err := local[struct{}](t, h, h.acts.Finalize, activities.FinalizeInput{
			RequestID: "r1", Pool: request.PoolShort, EventType: events.TypeError,
			Failure: &events.Failure{Reason: "internal", Message: "x"},
		})
		return err
	}(); err != nil {
		t.Fatal(err)
	}
	_, err := local[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{
		RequestID: "r1", Pool: request.PoolShort, Recheck: true,
	})
	wantAppError(t, err, activities.ErrTypeCancelled, true)
	if s := h.stats(t, request.PoolShort); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("stats %+v: a released request took a place again", s)
	}
}

func TestAdmitWakesWaitersItGranted(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	h.admit(t, "waiter", "queued")
	// The holder's permit disappears without a release (as when its lease
	// ran out): the next Enqueue, by anyone, hands it to the waiter.
	if err := h.rdb.ZRem(context.Background(), h.prefix+"adm:{short}:permits", "holder").Err(); err != nil {
		t.Fatal(err)
	}
	out := h.admit(t, "late", "queued")
	if out.Position != 1 {
		t.Fatalf("late: %+v, want queued first behind the woken waiter", out)
	}
	if got, want := h.notifier.woken(), []string{"short/waiter"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "waiter"); !ok {
		t.Fatal("woken waiter holds no permit")
	}
}

func TestRetrieveCachesByKBVersion(t *testing.T) {
	h := newHarness(t, nil)
	version, err := h.kb.KBVersion(context.Background(), kbName)
	if err != nil || version <= 0 {
		t.Fatalf("kb version %d, %v: the kb must be versioned for the cache", version, err)
	}
	in := activities.RetrieveInput{RequestID: "r1", KB: kbName, Query: query, K: 8}
	first := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, in)
	if first.CacheHit || first.KBVersion != version || len(first.Hits) != in.K {
		t.Fatalf("first retrieve: hit %v, version %d, %d hits; want a miss of version %d with %d hits",
			first.CacheHit, first.KBVersion, len(first.Hits), version, in.K)
	}
	for i, hit := range first.Hits {
		if hit.ID == "" || (i > 0 && hit.Score > first.Hits[i-1].Score) {
			t.Fatalf("hits not best first with ids: %+v", first.Hits)
		}
	}
	in.RequestID = "r2"
	second := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, in)
	if !second.CacheHit || second.KBVersion != version || !slices.Equal(second.Hits, first.Hits) {
		t.Fatalf("second retrieve: %+v, want a cache hit with the first's hits", second)
	}
	for _, id := range []string{"r1", "r2"} {
		evs := h.events(t, id)
		if len(evs) != 1 {
			t.Fatalf("%s events: %+v, want one", id, evs)
		}
		if st := decode[events.Stage](t, evs[0]); st.Stage != "retrieval" {
			t.Fatalf("%s stage event %+v, want retrieval", id, st)
		}
	}
}

func TestRetrieveUnknownKB(t *testing.T) {
	h := newHarness(t, nil)
	_, err := local[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{
		RequestID: "r1", KB: "no-such-kb", Query: query, K: 3,
	})
	wantAppError(t, err, activities.ErrTypeBadRequest, true)
	// Stage events mark a stage's start, so the failed stage has its one.
	if evs := h.events(t, "r1"); len(evs) != 1 || evs[0].Type != events.TypeStage {
		t.Fatalf("events for a failed retrieval: %+v", evs)
	}
}

func TestRerankKeepsBestK(t *testing.T) {
	h := newHarness(t, nil)
	ret := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{
		RequestID: "r1", KB: kbName, Query: query, K: 10,
	})
	out := mustLocal[activities.RerankOutput](t, h, h.acts.Rerank, activities.RerankInput{
		RequestID: "r1", KB: kbName, KBVersion: ret.KBVersion, Query: query, Hits: ret.Hits, K: 3,
	})
	if len(out.Hits) != 3 {
		t.Fatalf("kept %d hits, want 3", len(out.Hits))
	}
	candidates := map[string]bool{}
	for _, hit := range ret.Hits {
		candidates[hit.ID] = true
	}
	seen := map[string]bool{}
	for i, hit := range out.Hits {
		if !candidates[hit.ID] || seen[hit.ID] {
			t.Fatalf("hit %q is not a distinct candidate: %+v", hit.ID, out.Hits)
		}
		seen[hit.ID] = true
		if i > 0 && hit.Score > out.Hits[i-1].Score {
			t.Fatalf("hits not best first: %+v", out.Hits)
		}
	}
	// The refs resolve to the kb's chunks.
	if _, err := h.kb.Lookup(context.Background(), kbName, ret.KBVersion, []string{out.Hits[0].ID}); err != nil {
		t.Fatal(err)
	}
	st := ofType(h.events(t, "r1"), events.TypeStage)
	if len(st) != 2 || decode[events.Stage](t, st[1]).Stage != "rerank" {
		t.Fatalf("stage events %+v, want retrieval then rerank", st)
	}
}

func TestRerankStaleKBVersion(t *testing.T) {
	h := newHarness(t, nil)
	ret := mustLocal[activities.RetrieveOutput](t, h, h.acts.Retrieve, activities.RetrieveInput{
		RequestID: "r1", KB: kbName, Query: query, K: 5,
	})
	_, err := local[activities.RerankOutput](t, h, h.acts.Rerank, activities.RerankInput{
		RequestID: "r1", KB: kbName, KBVersion: ret.KBVersion + 1, Query: query, Hits: ret.Hits, K: 3,
	})
	// Rerank runs as a local activity, whose error reaches the SDK's retry
	// decision unconverted: errors.As finds the non-retryable error inside
	// the wrapping, as temporal.IsRetryable does.
	wantAppError(t, err, activities.ErrTypeBadRequest, true)
	if !errors.Is(err, retrieval.ErrStaleKB) {
		t.Fatalf("error %v does not say the kb is stale", err)
	}
}

func TestStreamLLMWritesTokensInOrder(t *testing.T) {
	toks := []string{"Admission", " control", " queues", " requests", "."}
	for _, tc := range []struct {
		name  string
		usage *llm.Usage
	}{
		{"usage reported", &llm.Usage{PromptTokens: 321, CompletionTokens: 5, TotalTokens: 326}},
		{"usage counted", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeLLM{tokens: toks, usage: tc.usage}
			h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
			version, hits := h.retrieveContext(t, "r1", 10, 3)
			out, err := stream(t, h, activities.LLMInput{
				RequestID: "r1", Pool: request.PoolShort, Query: query,
				KB: kbName, KBVersion: version, Context: hits, MaxTokens: 64,
			}, nil)
			if err != nil {
				t.Fatal(err)
			}

			evs := h.events(t, "r1")
			var llmStage int
			for i, ev := range evs {
				if ev.Type == events.TypeStage && decode[events.Stage](t, ev).Stage == "llm" {
					llmStage = i
				}
			}
			got := ofType(evs, events.TypeToken)
			if len(got) != len(toks) || evs[llmStage+1].Type != events.TypeToken {
				t.Fatalf("events %+v: want the llm stage, then %d tokens", evs, len(toks))
			}
			if st := decode[events.Stage](t, evs[llmStage]); st.Pool != request.PoolShort {
				t.Fatalf("llm stage event %+v, want pool short", st)
			}
			for i, ev := range got {
				if tok := decode[events.Token](t, ev); tok.Index != i || tok.Text != toks[i] {
					t.Fatalf("token event %d: %+v, want %q at %d", i, tok, toks[i], i)
				}
			}

			reqs := fake.requests()
			if len(reqs) != 1 || reqs[0].MaxTokens != 64 || reqs[0].Model != "fake" {
				t.Fatalf("llm requests %+v", reqs)
			}
			want := events.Usage{PromptTokens: h.acts.Prompts.Count(reqs[0].Messages), CompletionTokens: len(toks)}
			if tc.usage != nil {
				want = events.Usage{PromptTokens: tc.usage.PromptTokens, CompletionTokens: tc.usage.CompletionTokens, Reported: true}
			}
			want.TotalTokens = want.PromptTokens + want.CompletionTokens
			if out.Usage != want {
				t.Fatalf("usage %+v, want %+v", out.Usage, want)
			}
			if out.FinishReason != "stop" || out.ContextShed != 0 || len(out.Sources) == 0 {
				t.Fatalf("output %+v, want finished with sources and nothing shed", out)
			}
		})
	}
}

func TestStreamLLMStopsOnStopFlag(t *testing.T) {
	const stopAt = 2
	var h *harness
	fake := &fakeLLM{tokens: words(200), delay: time.Millisecond}
	fake.onToken = func(i int) bool {
		if i == stopAt {
			if _, err := local[struct{}](t, h, h.acts.StopStream, activities.StopStreamInput{RequestID: "r1"}); err != nil {
				t.Error(err)
			}
		}
		return false
	}
	h = newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	wantAppError(t, err, activities.ErrTypeCancelled, true)
	// The token written with the flag read is the last.
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n <= stopAt || n > stopAt+2 {
		t.Fatalf("%d tokens streamed, want the stream to stop right after token %d", n, stopAt)
	}
}

func TestStreamLLMInterruptedAttemptIsNotRetried(t *testing.T) {
	fake := &fakeLLM{tokens: words(3)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	evsBefore := len(h.events(t, "r1"))
	// The heartbeat detail of a lost attempt that had streamed 5 tokens.
	_, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, struct{ Tokens int }{Tokens: 5})
	wantAppError(t, err, activities.ErrTypeStreamInterrupted, true)
	if n := len(fake.requests()); n != 0 {
		t.Fatalf("the llm was called %d times, want never", n)
	}
	if n := len(h.events(t, "r1")); n != evsBefore {
		t.Fatalf("the new attempt wrote %d events", n-evsBefore)
	}
}

func TestStreamLLMFreshAttemptWithZeroProgressRuns(t *testing.T) {
	fake := &fakeLLM{tokens: words(2)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	// A previous attempt that heartbeated before its first token.
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, struct{ Tokens int }{Tokens: 0}); err != nil {
		t.Fatal(err)
	}
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n != 2 {
		t.Fatalf("%d tokens, want 2", n)
	}
}

func TestStreamLLMBackendErrors(t *testing.T) {
	for _, tc := range []struct {
		name         string
		fake         *fakeLLM
		typ          string
		nonRetryable bool
		tokens       int
	}{
		{
			name: "retryable before the first token",
			fake: &fakeLLM{tokens: words(5), err: &llm.Error{Endpoint: "fake", Status: 503, Message: "overloaded", Retryable: true}},
			typ:  activities.ErrTypeBackend,
		},
		{
			name: "rejected before the first token",
			fake: &fakeLLM{tokens: words(5), err: &llm.Error{Endpoint: "fake", Status: 400, Message: "bad request"}},
			typ:  activities.ErrTypeBadRequest, nonRetryable: true,
		},
		{
			name: "retryable after tokens",
			fake: &fakeLLM{tokens: words(5), failAfter: 3, err: &llm.Error{Endpoint: "fake", Message: "stream broken", Retryable: true}},
			typ:  activities.ErrTypeStreamInterrupted, nonRetryable: true, tokens: 3,
		},
		{
			name: "after the last token",
			fake: &fakeLLM{tokens: words(2), failAfter: 2, err: &llm.Error{Endpoint: "fake", Message: "no finish_reason", Retryable: true}},
			typ:  activities.ErrTypeStreamInterrupted, nonRetryable: true, tokens: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOptions) { o.streamer = tc.fake })
			version, hits := h.retrieveContext(t, "r1", 10, 3)
			_, err := stream(t, h, activities.LLMInput{
				RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
			}, nil)
			wantAppError(t, err, tc.typ, tc.nonRetryable)
			if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n != tc.tokens {
				t.Fatalf("%d tokens streamed, want %d", n, tc.tokens)
			}
		})
	}
}

func TestStreamLLMShedsContextToFitPool(t *testing.T) {
	const keep = 2
	fake := &fakeLLM{tokens: words(3)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 6)
	if len(hits) != 6 {
		t.Fatalf("%d hits, want 6", len(hits))
	}
	ids := make([]string, len(hits))
	for i, hit := range hits {
		ids[i] = hit.ID
	}
	chunks, err := h.kb.Lookup(context.Background(), kbName, version, ids)
	if err != nil {
		t.Fatal(err)
	}
	fits := h.acts.Prompts.Count(h.acts.Prompts.Messages(chunks[:keep], query))
	if next := h.acts.Prompts.Count(h.acts.Prompts.Messages(chunks[:keep+1], query)); next <= fits {
		t.Fatalf("prompt with %d chunks (%d tokens) is not longer than with %d (%d)", keep+1, next, keep, fits)
	}
	h.acts.Pools[request.PoolShort] = activities.Pool{Streamer: fake, Model: "fake", MaxPromptTokens: fits}

	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.ContextShed != len(hits)-keep {
		t.Fatalf("shed %d chunks, want %d", out.ContextShed, len(hits)-keep)
	}
	reqs := fake.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d llm requests, want 1", len(reqs))
	}
	sys := reqs[0].Messages[0].Content
	if !strings.Contains(sys, fmt.Sprintf("[%d] ", keep)) || strings.Contains(sys, fmt.Sprintf("[%d] ", keep+1)) {
		t.Fatalf("system prompt does not hold exactly the best %d chunks:\n%s", keep, sys)
	}
	if n := h.acts.Prompts.Count(reqs[0].Messages); n > fits || out.Usage.PromptTokens != n {
		t.Fatalf("prompt sent has %d tokens (usage says %d), pool allows %d", n, out.Usage.PromptTokens, fits)
	}
	var wantSources []string
	for _, c := range chunks[:keep] {
		if !slices.Contains(wantSources, c.DocID) {
			wantSources = append(wantSources, c.DocID)
		}
	}
	if !slices.Equal(out.Sources, wantSources) {
		t.Fatalf("sources %v, want those of the kept chunks %v", out.Sources, wantSources)
	}
}

func TestStreamLLMRenewsPermitLease(t *testing.T) {
	// keepAlive renews at most once a second (its tick), so the stream
	// runs until the lease was seen to grow, for at most 2.5 s.
	var h *harness
	var first float64
	var grew atomic.Bool
	fake := &fakeLLM{tokens: words(100), delay: 25 * time.Millisecond}
	fake.onToken = func(i int) bool {
		// Not t.Fatal: this runs inside the activity.
		exp, err := h.rdb.ZScore(context.Background(), h.prefix+"adm:{short}:permits", "r1").Result()
		if err != nil {
			t.Errorf("read the permit's lease: %v (redis.Nil: the permit was lost)", err)
			return true
		}
		if i == 0 {
			first = exp
		}
		if exp-first >= 500 {
			grew.Store(true)
			return true
		}
		return false
	}
	h = newHarness(t, func(o *harnessOptions) {
		o.streamer = fake
		// A lease over two ticks, so that the test does not depend on
		// which tick renews first.
		o.lease = 2500 * time.Millisecond
	})
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil); err != nil {
		t.Fatal(err)
	}
	if !grew.Load() {
		t.Fatal("the permit's lease was not renewed during a 2.5 s stream")
	}
}

func TestStreamLLMKeepsPermitWithSubSecondLease(t *testing.T) {
	var h *harness
	fake := &fakeLLM{tokens: words(30), delay: 25 * time.Millisecond} // 750 ms
	h = newHarness(t, func(o *harnessOptions) {
		o.streamer = fake
		o.lease = 300 * time.Millisecond
	})
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	if _, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil); err != nil {
		t.Fatal(err)
	}
	held, err := h.gate.Renew(context.Background(), request.PoolShort, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if !held {
		t.Fatal("permit lost during a 750 ms stream with a 300 ms lease")
	}
}

func TestStreamLLMStaleKBIsNotRetried(t *testing.T) {
	fake := &fakeLLM{tokens: words(2)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version + 1, Context: hits,
	}, nil)
	if len(fake.requests()) != 0 {
		t.Fatal("the llm was called with context of another kb version")
	}
	appErr := appError(t, err)
	if appErr.Type() != activities.ErrTypeBadRequest || !appErr.NonRetryable() {
		t.Fatalf("stale kb must fail non-retryably as BadRequest, got %q: %v", appErr.Type(), err)
	}
}

func TestStreamLLMAgainstSimulator(t *testing.T) {
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale = 0.01
	sim, err := llmsim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(func() {
		srv.Close()
		sim.Close()
	})
	client, err := llm.NewOpenAI(llm.OpenAIOptions{Endpoints: []string{srv.URL}, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	const maxTokens = 8
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits, MaxTokens: maxTokens,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The answer's tokens, then the notice that it was cut.
	toks := ofType(h.events(t, "r1"), events.TypeToken)
	if len(toks) != maxTokens+1 || decode[events.Token](t, toks[maxTokens]).Text != h.acts.Options.TruncationNotice {
		t.Fatalf("%d token events, want %d and the truncation notice", len(toks), maxTokens)
	}
	for i, ev := range toks {
		if tok := decode[events.Token](t, ev); tok.Index != i || tok.Text == "" {
			t.Fatalf("token event %d: %+v", i, tok)
		}
	}
	if out.FinishReason != "length" || !out.Usage.Reported || out.Usage.CompletionTokens != maxTokens ||
		out.Usage.PromptTokens <= 0 || out.Usage.TotalTokens != out.Usage.PromptTokens+maxTokens {
		t.Fatalf("output %+v, want %d tokens cut by length with reported usage", out, maxTokens)
	}
	// The simulator counts the prompt with the same tokenizer and chat
	// framing the builder uses.
	chunks, err := h.kb.Lookup(context.Background(), kbName, version, []string{hits[0].ID, hits[1].ID, hits[2].ID})
	if err != nil {
		t.Fatal(err)
	}
	if want := h.acts.Prompts.Count(h.acts.Prompts.Messages(chunks, query)); out.Usage.PromptTokens != want {
		t.Fatalf("reported prompt tokens %d, builder counts %d", out.Usage.PromptTokens, want)
	}
}

func TestStreamLLMSimulatorRejectsPrompt(t *testing.T) {
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale = 0.01
	cfg.KVCacheBlocks, cfg.BlockSize = 2, 16 // a 32-token context
	sim, err := llmsim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(func() {
		srv.Close()
		sim.Close()
	})
	client, err := llm.NewOpenAI(llm.OpenAIOptions{Endpoints: []string{srv.URL}, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err = stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	wantAppError(t, err, activities.ErrTypeBadRequest, true)
	if !strings.Contains(err.Error(), "400") {
		t.Fatalf("error %v does not carry the backend's 400", err)
	}
}

func finalize(t *testing.T, h *harness, in activities.FinalizeInput) {
	t.Helper()
	if _, err := local[struct{}](t, h, h.acts.Finalize, in); err != nil {
		t.Fatal(err)
	}
}

func done(requestID string) activities.FinalizeInput {
	return activities.FinalizeInput{
		RequestID: requestID, Pool: request.PoolShort, EventType: events.TypeDone,
		Done: &events.Done{RequestID: requestID, Route: request.PoolShort, FinishReason: "stop"},
	}
}

func TestFinalizeHandsPermitToNextWaiter(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	h.admit(t, "waiter", "queued")
	finalize(t, h, done("holder"))

	if got, want := h.notifier.woken(), []string{"short/waiter"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "waiter"); !ok {
		t.Fatal("the waiter was not handed the permit")
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "holder"); ok {
		t.Fatal("the finalized request still holds its permit")
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want the permit in use by the waiter and nobody queued", s)
	}
	last, ok, err := h.log.Last(context.Background(), "holder")
	if err != nil || !ok || last.Type != events.TypeDone {
		t.Fatalf("last event %+v, %v, %v: want done", last, ok, err)
	}
	if d := decode[events.Done](t, last); d.RequestID != "holder" || d.Route != request.PoolShort {
		t.Fatalf("done event %+v", d)
	}
}

func TestFinalizeAllPools(t *testing.T) {
	h := newHarness(t, nil)
	// Admission's answer was lost: the request may hold something in
	// either pool, here a permit in one and a queue place in the other.
	h.enqueue(t, request.PoolShort, "r1")
	h.enqueue(t, request.PoolLong, "other")
	if res := h.enqueue(t, request.PoolLong, "r1"); res.Status != admission.Queued {
		t.Fatalf("r1 in long: %v, want queued", res.Status)
	}
	finalize(t, h, activities.FinalizeInput{
		RequestID: "r1", AllPools: true, EventType: events.TypeError,
		Failure: &events.Failure{Reason: "cancelled", Message: "cancelled"},
	})
	if s := h.stats(t, request.PoolShort); s.InUse != 0 || s.Waiting != 0 {
		t.Fatalf("short: %+v, want the permit back", s)
	}
	if s := h.stats(t, request.PoolLong); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("long: %+v, want the queue place given up", s)
	}
	for _, pool := range h.gate.Pools() {
		if res := h.enqueue(t, pool, "r1"); res.Status != admission.Gone {
			t.Fatalf("r1 in %s after finalize: %v, want gone", pool, res.Status)
		}
	}
	last, ok, err := h.log.Last(context.Background(), "r1")
	if err != nil || !ok || last.Type != events.TypeError {
		t.Fatalf("last event %+v, %v, %v: want error", last, ok, err)
	}
	if f := decode[events.Failure](t, last); f.Reason != "cancelled" {
		t.Fatalf("failure event %+v", f)
	}
}

func TestFinalizeSkipsGoneWaiter(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	h.admit(t, "gone", "queued")
	h.admit(t, "live", "queued")
	h.notifier.setGone("gone")
	finalize(t, h, done("holder"))

	if got, want := h.notifier.woken(), []string{"short/gone", "short/live"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "live"); !ok {
		t.Fatal("the live waiter was not handed the permit")
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "gone"); ok {
		t.Fatal("the gone waiter kept its permit")
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want one permit in use and nobody queued", s)
	}
}

func TestFinalizeTwiceFreesOnce(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	h.admit(t, "next", "queued")
	h.admit(t, "after", "queued")
	finalize(t, h, done("holder"))
	finalize(t, h, done("holder"))

	if got, want := h.notifier.woken(), []string{"short/next"}; !slices.Equal(got, want) {
		t.Fatalf("woke %v, want %v", got, want)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 1 {
		t.Fatalf("stats %+v: the second finalize freed a permit", s)
	}
	if _, ok := h.permitExpiry(t, request.PoolShort, "after"); ok {
		t.Fatal("the second finalize granted the next waiter too")
	}
}

func TestFinalizeStopsRunningStream(t *testing.T) {
	var h *harness
	fake := &fakeLLM{tokens: words(200), delay: time.Millisecond}
	fake.onToken = func(i int) bool {
		if i == 1 {
			in := done("r1")
			in.StopStream = true
			// Not t.Fatal: this runs inside the activity.
			if _, err := local[struct{}](t, h, h.acts.Finalize, in); err != nil {
				t.Error(err)
			}
		}
		return false
	}
	h = newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	h.admit(t, "r1", "granted")
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	wantAppError(t, err, activities.ErrTypeCancelled, true)
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n > 4 {
		t.Fatalf("%d tokens streamed after the stop flag was raised at token 1", n)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 0 {
		t.Fatalf("stats %+v, want the permit released", s)
	}
}

// The stream writes the done event itself as soon as the answer is
// complete, from what the workflow knew plus what it measured.
func TestStreamLLMWritesDone(t *testing.T) {
	fake := &fakeLLM{tokens: words(4)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	out, err := stream(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
		Done: &events.Done{RequestID: "r1", Route: "short", KBVersion: version, Timings: []events.StageTiming{{Stage: "embed", Ms: 1}}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !out.DoneWritten {
		t.Fatal("DoneWritten not reported")
	}
	evs := h.events(t, "r1")
	last := evs[len(evs)-1]
	if last.Type != events.TypeDone {
		t.Fatalf("last event %s, want done", last.Type)
	}
	done := decode[events.Done](t, last)
	if done.Route != "short" || done.KBVersion != version || done.Usage.CompletionTokens != 4 || len(done.Sources) == 0 {
		t.Fatalf("done %+v", done)
	}
	var stages []string
	for _, st := range done.Timings {
		stages = append(stages, st.Stage)
	}
	if strings.Join(stages, ",") != "embed,llm_first_token,llm" {
		t.Fatalf("done timings %v", stages)
	}
}

// A retried attempt whose predecessor finished and wrote done (then was
// lost before reporting) reports that answer instead of failing it.
func TestStreamLLMRetryAfterDoneReportsIt(t *testing.T) {
	fake := &fakeLLM{tokens: words(3)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	in := activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
		Done: &events.Done{RequestID: "r1", Route: "short", KBVersion: version},
	}
	first, err := stream(t, h, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	evsBefore := len(h.events(t, "r1"))
	again, err := stream(t, h, in, struct{ Tokens int }{Tokens: 3})
	if err != nil {
		t.Fatalf("retry after a written done: %v", err)
	}
	if !again.DoneWritten || again.Usage != first.Usage || again.FinishReason != first.FinishReason {
		t.Fatalf("retry reported %+v, first was %+v", again, first)
	}
	if n := len(fake.requests()); n != 1 {
		t.Fatalf("the llm was called %d times, want once", n)
	}
	if n := len(h.events(t, "r1")); n != evsBefore {
		t.Fatalf("the retry wrote %d events", n-evsBefore)
	}
}

// A request whose permit was reclaimed before its stream started does not
// call the LLM: it is told to queue again.
func TestStreamLLMWithoutPermitQueuesAgain(t *testing.T) {
	fake := &fakeLLM{tokens: words(4)}
	h := newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	_, err := streamAsIs(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil)
	wantAppError(t, err, activities.ErrTypePermitLost, true)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.reqs) != 0 {
		t.Fatalf("the LLM was called %d times without a permit", len(fake.reqs))
	}
	if n := len(ofType(h.events(t, "r1"), events.TypeToken)); n != 0 {
		t.Fatalf("%d tokens written by a stream that never started", n)
	}
}

// A request whose turn is near waits in Admit for its grant and is told at
// once when the holder ahead of it releases, without waiting for the
// signal; with nobody releasing it gives up after FastWait, still queued.
func TestAdmitFastWait(t *testing.T) {
	h := newHarness(t, nil)
	h.admit(t, "holder", "granted")
	type result struct {
		out  activities.AdmitOutput
		err  error
		took time.Duration
	}
	admit := func(id string, fastWait time.Duration) <-chan result {
		done := make(chan result, 1)
		go func() {
			start := time.Now()
			out, err := local[activities.AdmitOutput](t, h, h.acts.Admit, activities.AdmitInput{RequestID: id, Query: query, FastWait: fastWait})
			done <- result{out, err, time.Since(start)}
		}()
		return done
	}
	done := admit("r1", 2*time.Second)
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	if _, err := local[struct{}](t, h, h.acts.Finalize, activities.FinalizeInput{RequestID: "holder", Pool: request.PoolShort}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !r.out.Granted {
		t.Fatalf("admit r1: %+v %v", r.out, r.err)
	}
	if d := time.Since(released); d > time.Second {
		t.Fatalf("r1 learned of its grant %v after the release: not from the announcement", d)
	}
	if s := h.stats(t, request.PoolShort); s.InUse != 1 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want r1 holding the permit", s)
	}
	h.notifier.mu.Lock()
	signalled := slices.Contains(h.notifier.calls, request.PoolShort+"/r1")
	h.notifier.mu.Unlock()
	if signalled {
		t.Fatal("r1 was signalled although it heard of its grant while waiting fast")
	}

	r = <-admit("r2", time.Second)
	if r.err != nil || r.out.Granted || r.out.Position != 1 {
		t.Fatalf("admit r2 with nobody releasing: %+v %v", r.out, r.err)
	}
	if r.took < time.Second {
		t.Fatalf("r2 gave up after %v, want FastWait", r.took)
	}
}
