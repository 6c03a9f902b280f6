package holdings_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var (
	srv *testenv.Redis
	// worlds numbers the worlds a test process builds, so that each gets
	// keys of its own, also under -count=N.
	worlds atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

const (
	pool   = "p"
	tenant = "acme"
	// req is the request whose holdings are given back; waiter queues
	// behind it for the pool's one permit.
	req    = "r"
	waiter = "w"
)

// price is what the budget charges: micro-dollars per token.
var price = budget.Price{Input: 1, Output: 2}

// buckets are the rate limits the request is charged against: 300 tokens
// of 1000 and one request of 5, refilling too slowly to matter.
func buckets(cost float64) []limiter.Bucket {
	return []limiter.Bucket{
		{Dimension: "tenant", ID: tenant, Kind: limiter.Tokens, Capacity: 1000, PerSecond: 0.001, Cost: cost},
		{Dimension: "tenant", ID: tenant, Kind: limiter.Requests, Capacity: 5, PerSecond: 0.001, Cost: min(cost, 1)},
	}
}

// world is one gate, limiter, budget counter and key store on fresh keys.
type world struct {
	prefix string
	gate   *admission.Gate
	lim    *limiter.Limiter
	budget *budget.Counter
	keys   *idempotency.Store
	rdb    *redis.Client
}

func newWorld(t *testing.T) *world {
	t.Helper()
	rdb := srv.Client(t)
	w := &world{prefix: fmt.Sprintf("%s%d:", testenv.KeyPrefix(t), worlds.Add(1)), rdb: rdb}
	w.gate, w.lim, w.budget, w.keys = w.on(t, rdb)
	return w
}

// on builds the world's components over rdb (a broken client, for tests
// of failure), on the world's keys.
func (w *world) on(t *testing.T, rdb *redis.Client) (*admission.Gate, *limiter.Limiter, *budget.Counter, *idempotency.Store) {
	t.Helper()
	g, err := admission.New(rdb, admission.Options{
		KeyPrefix: w.prefix, Lease: time.Minute, WaiterTTL: time.Minute, MaxQueueDepth: 100, Limits: map[string]int{pool: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g, limiter.New(rdb, limiter.Options{KeyPrefix: w.prefix, ReservationTTL: time.Minute}),
		budget.New(rdb, budget.Options{KeyPrefix: w.prefix}), idempotency.New(rdb, w.prefix, time.Minute)
}

// returner gives back into the world, waking through n.
func (w *world) returner(n admission.Notifier, logger *slog.Logger) *holdings.Returner {
	return &holdings.Returner{Gate: w.gate, Notifier: n, Limiter: w.lim, Budgets: w.budget, Keys: w.keys, Logger: logger}
}

// hold makes req hold everything: the pool's one permit (waiter queued
// behind it), a place of its tenant, 300 tokens and a request of the rate
// limits, a budget charge of 300 tokens (500 micro-dollars) and an
// idempotency key.
func (w *world) hold(t *testing.T) holdings.Holdings {
	t.Helper()
	ctx := context.Background()
	for _, id := range []string{req, waiter} {
		if _, err := w.gate.Enqueue(ctx, pool, admission.Request{ID: id, Tenant: id, Weight: 1}); err != nil {
			t.Fatal(err)
		}
	}
	place, _, err := w.gate.Reserve(ctx, pool, tenant, 1, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rate, err := w.lim.Reserve(ctx, req, buckets(300))
	if err != nil || rate.Status != limiter.Allowed {
		t.Fatalf("reserve rate limits: %+v, %v", rate, err)
	}
	charge, err := w.budget.Reserve(ctx, budget.Charge{Tenant: tenant, RequestID: req, PromptTokens: 100, OutputTokens: 200, Price: price},
		budget.Limit{Tokens: 100000})
	if err != nil || !charge.Allowed {
		t.Fatalf("reserve budget: %+v, %v", charge, err)
	}
	key, err := w.keys.KeyFor(tenant, "u", "k-"+req, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if _, won, err := w.keys.Claim(ctx, key, req); err != nil || !won {
		t.Fatalf("claim key: won %v, %v", won, err)
	}
	h := holdings.Holdings{RequestID: req, Pools: []string{pool}, Place: place, Rate: rate.Reservation, Budget: charge.Reservation, Key: &key}
	if got, want := w.state(t, h), (state{holder: req, queued: waiter, places: 1, tokens: 700, requests: 4, spentTokens: 300, spentMicros: 500, keyHolder: req}); got != want {
		t.Fatalf("holding everything: %+v, want %+v", got, want)
	}
	return h
}

// state is what the world shows of a request's holdings.
type state struct {
	// holder holds the pool's permit; queued waits for it.
	holder, queued string
	// places are the tenant's places reserved at the door.
	places int
	// tokens and requests are the rate limits' levels.
	tokens, requests float64
	// spentTokens and spentMicros are the tenant's month.
	spentTokens, spentMicros int64
	// keyHolder holds the idempotency key ("": nobody).
	keyHolder string
}

func (w *world) state(t *testing.T, h holdings.Holdings) state {
	t.Helper()
	ctx := context.Background()
	var s state
	// Each request is its own tenant: the gate's tenants are its requests.
	qs, err := w.gate.QueueStats(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(qs.HeldByTenant) > 1 || len(qs.ByTenant) > 1 {
		t.Fatalf("held %v, queued %v: more than one each", qs.HeldByTenant, qs.ByTenant)
	}
	for id := range qs.HeldByTenant {
		s.holder = id
	}
	for id := range qs.ByTenant {
		s.queued = id
	}
	s.places = w.places(t)
	// A probe of no cost reads the levels and charges nothing.
	d, err := w.lim.Reserve(ctx, "probe", buckets(0))
	if err != nil {
		t.Fatal(err)
	}
	s.tokens, s.requests = math.Round(d.Remaining[0]), math.Round(d.Remaining[1])
	st, err := w.budget.Status(ctx, tenant, budget.Limit{Tokens: 100000})
	if err != nil {
		t.Fatal(err)
	}
	s.spentTokens, s.spentMicros = st.Used.Tokens, st.Used.Micros
	if h.Key != nil {
		c, ok, err := w.keys.Lookup(ctx, *h.Key)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			s.keyHolder = c.RequestID
		}
	}
	return s
}

// places counts the tenant's places reserved at the door, from the hash
// admission keeps them in ("<prefix>adm:{<pool>}:reserved", field tenant,
// value "<count>:<expiry ms>"): no call of the gate shows them.
func (w *world) places(t *testing.T) int {
	t.Helper()
	v, err := w.rdb.HGet(context.Background(), w.prefix+"adm:{"+pool+"}:reserved", tenant).Result()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var n, expiry int64
	if _, err := fmt.Sscanf(v, "%d:%d", &n, &expiry); err != nil {
		t.Fatalf("reserved %q: %v", v, err)
	}
	return int(n)
}

// notifier records whom it woke; fail, if set, is its answer.
type notifier struct {
	mu    sync.Mutex
	woken []string
	fail  error
}

func (n *notifier) NotifyGranted(_ context.Context, pool, id string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.woken = append(n.woken, pool+"/"+id)
	return false, n.fail
}

func (n *notifier) Woken() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.woken)
}

func newLogger() (*slog.Logger, *testenv.SyncBuffer) {
	buf := &testenv.SyncBuffer{}
	return slog.New(slog.NewTextHandler(buf, nil)), buf
}

// Everything a request holds comes back once, settled by what it used;
// the permit goes to the waiter behind it, who is woken. Giving back what
// is left (nothing) changes nothing.
func TestGiveBackReturnsEachHoldingOnce(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	h := w.hold(t)
	n := &notifier{}
	r := w.returner(n, nil)
	used := holdings.Used{Rate: &holdings.RateUse{Tokens: 100, Requests: 1}, PromptTokens: 10, CompletionTokens: 20}

	rest, err := r.GiveBack(ctx, h, used)
	if err != nil {
		t.Fatal(err)
	}
	if !rest.Empty() || rest.RequestID != req {
		t.Fatalf("rest %+v, want nothing held by %s", rest, req)
	}
	want := state{holder: waiter, tokens: 900, requests: 4, spentTokens: 30, spentMicros: 10 + 2*20}
	if got := w.state(t, h); got != want {
		t.Fatalf("after GiveBack: %+v, want %+v", got, want)
	}
	if got := n.Woken(); !slices.Equal(got, []string{pool + "/" + waiter}) {
		t.Fatalf("woken %v, want the waiter", got)
	}

	// Again, as a retry after a lost reply would: every step but the
	// place's finds nothing left to give back.
	again := h
	again.Place = request.Place{}
	if rest, err := r.GiveBack(ctx, again, used); err != nil || !rest.Empty() {
		t.Fatalf("second GiveBack: rest %+v, %v", rest, err)
	}
	if got := w.state(t, h); got != want {
		t.Fatalf("after a second GiveBack: %+v, want %+v unchanged", got, want)
	}
	if got := n.Woken(); len(got) != 1 {
		t.Fatalf("woken %v by the second GiveBack, want the waiter once", got)
	}
}

// A place is given back once: its give-back is not idempotent (each
// takes one of its tenant's places, whichever), so what comes back to
// retry never holds one.
func TestGiveBackTriesAPlaceOnce(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	h := w.hold(t)
	// Another request of the tenant waits at the door with a place of its
	// own.
	if _, _, err := w.gate.Reserve(ctx, pool, tenant, 1, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	r := w.returner(&notifier{}, nil)
	rest, err := r.GiveBack(ctx, holdings.Holdings{RequestID: req, Place: h.Place}, holdings.Used{})
	if err != nil || rest.Place.Tag != 0 || !rest.Empty() {
		t.Fatalf("GiveBack of a place: rest %+v, %v; want none", rest, err)
	}
	if got := w.places(t); got != 1 {
		t.Fatalf("%d places after giving one of two back, want 1", got)
	}
	// Giving it back again would take the other request's place: the
	// reason GiveBack never returns one to retry.
	if err := w.gate.Unreserve(ctx, h.Place); err != nil {
		t.Fatal(err)
	}
	if got := w.places(t); got != 0 {
		t.Fatalf("%d places after a second Unreserve, want 0: it is not idempotent (update this test and GiveBack if it became so)", got)
	}
}

// What a request used settles each holding: no known rate use refunds
// nothing; a known one refunds the rest of the reservation; the tokens
// served settle the budget (none gives the charge back).
func TestGiveBackSettlesWhatWasUsed(t *testing.T) {
	for _, tc := range []struct {
		name string
		used holdings.Used
		want state
	}{{
		name: "nothing known",
		used: holdings.Used{},
		want: state{holder: waiter, tokens: 700, requests: 4},
	}, {
		name: "nothing used",
		used: holdings.Used{Rate: &holdings.RateUse{}},
		want: state{holder: waiter, tokens: 1000, requests: 5},
	}, {
		name: "served",
		used: holdings.Used{Rate: &holdings.RateUse{Tokens: 250, Requests: 1}, PromptTokens: 100, CompletionTokens: 150},
		want: state{holder: waiter, tokens: 750, requests: 4, spentTokens: 250, spentMicros: 100 + 2*150},
	}, {
		name: "more than reserved",
		used: holdings.Used{Rate: &holdings.RateUse{Tokens: 400, Requests: 1}, PromptTokens: 100, CompletionTokens: 300},
		want: state{holder: waiter, tokens: 700, requests: 4, spentTokens: 400, spentMicros: 100 + 2*300},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			h := w.hold(t)
			rest, err := w.returner(&notifier{}, nil).GiveBack(context.Background(), h, tc.used)
			if err != nil || !rest.Empty() {
				t.Fatalf("GiveBack: rest %+v, %v", rest, err)
			}
			if got := w.state(t, h); got != tc.want {
				t.Fatalf("after GiveBack: %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The queue cost a request used settles what its tenant was charged in
// the fair order for the permit it queued for: a request that used less
// than its bound leaves its tenant a credit; one whose use is unknown
// settles nothing.
func TestGiveBackSettlesTheFairOrderCharge(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cost     float64
		credited bool
	}{
		{"unknown", 0, false},
		{"less than charged", 0.5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			// a1 queues behind the holder and is granted; a2 keeps its
			// tenant from going idle (an idle tenant keeps no credit).
			for _, rq := range []admission.Request{
				{ID: "hold", Tenant: "x", Weight: 1},
				{ID: "a1", Tenant: "a", Weight: 1, Cost: 2},
				{ID: "a2", Tenant: "a", Weight: 1, Cost: 2},
			} {
				if _, err := w.gate.Enqueue(ctx, pool, rq); err != nil {
					t.Fatal(err)
				}
			}
			r := w.returner(&notifier{}, nil)
			for _, id := range []string{"hold", "a1"} {
				if _, err := r.GiveBack(ctx, holdings.Holdings{RequestID: id, Pools: []string{pool}}, holdings.Used{QueueCost: tc.cost}); err != nil {
					t.Fatal(err)
				}
			}
			// The tenants' credits, in admission's hash of them.
			credit, err := w.rdb.HGet(ctx, w.prefix+"adm:{"+pool+"}:credit", "a").Int()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			if got := credit > 0; got != tc.credited {
				t.Fatalf("tenant a's credit %d after a1 used %v; credited %v, want %v", credit, tc.cost, got, tc.credited)
			}
		})
	}
}

// A step that fails leaves its holding in what comes back, and only
// that: the other steps go through.
func TestGiveBackReturnsWhatFailed(t *testing.T) {
	for _, tc := range []struct {
		name string
		// spoil makes one holding impossible to give back.
		spoil func(*holdings.Holdings)
		// keep is what comes back, and the error names it.
		keep func(h holdings.Holdings) holdings.Holdings
		err  string
	}{{
		name:  "an unknown pool",
		spoil: func(h *holdings.Holdings) { h.Pools = append(h.Pools, "nowhere") },
		keep:  func(h holdings.Holdings) holdings.Holdings { return holdings.Holdings{Pools: []string{"nowhere"}} },
		err:   "release the permit or queue entry in nowhere",
	}, {
		name:  "a rate reservation",
		spoil: func(h *holdings.Holdings) { h.Rate = "not a reservation" },
		keep:  func(h holdings.Holdings) holdings.Holdings { return holdings.Holdings{Rate: h.Rate} },
		err:   "refund the rate limits",
	}, {
		name:  "a budget charge",
		spoil: func(h *holdings.Holdings) { h.Budget = "not a reservation" },
		keep:  func(h holdings.Holdings) holdings.Holdings { return holdings.Holdings{Budget: h.Budget} },
		err:   "settle the budget charge",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			h := w.hold(t)
			tc.spoil(&h)
			rest, err := w.returner(&notifier{}, nil).GiveBack(context.Background(), h, holdings.Used{Rate: &holdings.RateUse{}})
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("GiveBack error %v, want one naming %q", err, tc.err)
			}
			want := tc.keep(h)
			want.RequestID = req
			if !equal(rest, want) {
				t.Fatalf("rest %+v, want %+v", rest, want)
			}
		})
	}
}

// When Redis fails, every step but the place's comes back, each named in
// the error; the place is logged and left to lapse. Given back later on a
// working client, they all come back.
func TestGiveBackAfterRedisFailed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		broken func(t *testing.T) *redis.Client
	}{{
		name: "closed client",
		broken: func(t *testing.T) *redis.Client {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			_ = c.Close()
			return c
		},
	}, {
		name: "stopped server",
		broken: func(t *testing.T) *redis.Client {
			gone := testenv.StartRedis(t)
			gone.Stop()
			c := redis.NewClient(&redis.Options{Addr: gone.Addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			h := w.hold(t)
			before := w.state(t, h)
			logger, logs := newLogger()
			gate, lim, bud, keys := w.on(t, tc.broken(t))
			broken := &holdings.Returner{Gate: gate, Notifier: &notifier{}, Limiter: lim, Budgets: bud, Keys: keys, Logger: logger}
			used := holdings.Used{Rate: &holdings.RateUse{Tokens: 100, Requests: 1}, PromptTokens: 10, CompletionTokens: 20}

			rest, err := broken.GiveBack(ctx, h, used)
			if err == nil {
				t.Fatal("GiveBack on a broken client: no error")
			}
			for _, step := range []string{"release the permit or queue entry in p", "refund the rate limits", "settle the budget charge", "release the idempotency key"} {
				if !strings.Contains(err.Error(), step) {
					t.Errorf("error %q does not name %q", err, step)
				}
			}
			want := h
			want.Place = request.Place{}
			if !equal(rest, want) {
				t.Fatalf("rest %+v, want everything but the place %+v", rest, want)
			}
			if !strings.Contains(logs.String(), "give back a place in the fair order; it lapses") {
				t.Fatalf("the place's failed give-back was not logged: %s", logs)
			}
			if got := w.state(t, h); got != before {
				t.Fatalf("a failed GiveBack changed %+v to %+v", before, got)
			}

			if rest, err := w.returner(&notifier{}, nil).GiveBack(ctx, rest, used); err != nil || !rest.Empty() {
				t.Fatalf("GiveBack of the rest: rest %+v, %v", rest, err)
			}
			// The place was not given back: it lapses with its ttl.
			want2 := state{holder: waiter, places: 1, tokens: 900, requests: 4, spentTokens: 30, spentMicros: 50}
			if got := w.state(t, h); got != want2 {
				t.Fatalf("after giving back the rest: %+v, want %+v", got, want2)
			}
		})
	}
}

// A waiter the released permit goes to but that cannot be told is logged,
// not an error: the permit is its all the same, and it finds it itself.
func TestGiveBackLogsAWaiterNotWoken(t *testing.T) {
	w := newWorld(t)
	h := w.hold(t)
	logger, logs := newLogger()
	n := &notifier{fail: errors.New("workflow service unreachable")}
	rest, err := w.returner(n, logger).GiveBack(context.Background(), holdings.Holdings{RequestID: req, Pools: h.Pools}, holdings.Used{})
	if err != nil || !rest.Empty() {
		t.Fatalf("GiveBack with a waiter not woken: rest %+v, %v; want nothing and no error", rest, err)
	}
	if got := n.Woken(); len(got) != 1 {
		t.Fatalf("woken %v, want one try", got)
	}
	if got := w.state(t, h); got.holder != waiter {
		t.Fatalf("the waiter does not hold the permit: %+v", got)
	}
	if l := logs.String(); !strings.Contains(l, "wake granted waiters") || !strings.Contains(l, "requestID="+req) {
		t.Fatalf("the waiter not woken was not logged: %s", l)
	}
}

// A feature that is off (no limiter, budget or key store) gives back
// nothing of its kind, and keeps nothing of it to retry.
func TestGiveBackWithFeaturesOff(t *testing.T) {
	w := newWorld(t)
	h := w.hold(t)
	r := &holdings.Returner{Gate: w.gate, Notifier: &notifier{}}
	rest, err := r.GiveBack(context.Background(), h, holdings.Used{Rate: &holdings.RateUse{}})
	if err != nil || !rest.Empty() {
		t.Fatalf("GiveBack: rest %+v, %v", rest, err)
	}
	want := state{holder: waiter, tokens: 700, requests: 4, spentTokens: 300, spentMicros: 500, keyHolder: req}
	if got := w.state(t, h); got != want {
		t.Fatalf("after GiveBack: %+v, want %+v", got, want)
	}
}

func TestEmpty(t *testing.T) {
	key := &idempotency.Key{}
	for _, tc := range []struct {
		name string
		h    holdings.Holdings
		want bool
	}{
		{"zero", holdings.Holdings{}, true},
		{"a request id alone", holdings.Holdings{RequestID: req}, true},
		{"no pools", holdings.Holdings{Pools: []string{}}, true},
		{"a pool", holdings.Holdings{Pools: []string{pool}}, false},
		{"a place", holdings.Holdings{Place: request.Place{Pool: pool, Tag: 1}}, false},
		{"a place of no tag", holdings.Holdings{Place: request.Place{Pool: pool}}, true},
		{"a rate reservation", holdings.Holdings{Rate: "r1"}, false},
		{"a budget charge", holdings.Holdings{Budget: "b1"}, false},
		{"a key", holdings.Holdings{Key: key}, false},
	} {
		if got := tc.h.Empty(); got != tc.want {
			t.Errorf("%s: Empty() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// equal compares holdings, the key by identity.
func equal(a, b holdings.Holdings) bool {
	return a.RequestID == b.RequestID && slices.Equal(a.Pools, b.Pools) && a.Place == b.Place &&
		a.Rate == b.Rate && a.Budget == b.Budget && a.Key == b.Key
}

// A request that used more than its budget reservation is charged all of
// it and flagged: counted by the pool that answered and logged with the
// tenant it is charged to and by how much; one within it is not.
func TestGiveBackFlagsUsageOverTheBudgetReservation(t *testing.T) {
	for _, tc := range []struct {
		name              string
		prompt, completed int64
		wantOver          string
	}{
		{"over", 100, 300, "100"},
		{"within", 100, 150, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			h := w.hold(t)
			logger, logs := newLogger()
			r := w.returner(&notifier{}, logger)
			r.Metrics = metrics.New(logger)
			used := holdings.Used{PromptTokens: tc.prompt, CompletionTokens: tc.completed, Pool: pool}
			if rest, err := r.GiveBack(context.Background(), h, used); err != nil || !rest.Empty() {
				t.Fatalf("GiveBack: rest %+v, %v", rest, err)
			}
			if got := w.state(t, h); got.spentTokens != tc.prompt+tc.completed {
				t.Fatalf("spent %d tokens, want all %d charged", got.spentTokens, tc.prompt+tc.completed)
			}
			rec := httptest.NewRecorder()
			r.Metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			counted := `sluice_budget_overrun_tokens_total{pool="` + pool + `"} ` + tc.wantOver
			logged := "over_tokens=" + tc.wantOver
			if tc.wantOver == "" {
				if strings.Contains(rec.Body.String(), "sluice_budget_overrun_tokens_total{") || strings.Contains(logs.String(), "over_tokens") {
					t.Fatalf("a request within its reservation was flagged:\n%s\n%s", logs, rec.Body)
				}
				return
			}
			if !strings.Contains(rec.Body.String(), counted+"\n") {
				t.Fatalf("overrun not counted as %q:\n%s", counted, rec.Body)
			}
			if l := logs.String(); !strings.Contains(l, logged) || !strings.Contains(l, "tenant="+tenant) || !strings.Contains(l, "requestID="+req) {
				t.Fatalf("overrun not logged with %q, the tenant and the request: %s", logged, l)
			}
		})
	}
}
