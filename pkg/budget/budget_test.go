package budget

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

// now is mid-December 2026: the month resets at 2027-01-01T00:00:00Z.
var now = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

func newCounter(t *testing.T, rebuild Rebuild) (*Counter, *redis.Client) {
	t.Helper()
	rdb := srv.Client(t)
	return New(rdb, Options{KeyPrefix: testenv.KeyPrefix(t), Rebuild: rebuild, Now: func() time.Time { return now }}), rdb
}

// $1 and $2 per million tokens: a token costs 1 and 2 micro-dollars.
var price = Price{Input: 1, Output: 2}

func charge(id string, prompt, output int64) Charge {
	return Charge{Tenant: "acme", RequestID: id, PromptTokens: prompt, OutputTokens: output, Price: price}
}

// settle settles a reservation with prompt and completion tokens, priced
// as they were charged, and reports whether it settled.
func settle(ctx context.Context, c *Counter, reservation string, prompt, completion int64) (bool, error) {
	s, err := c.Settle(ctx, reservation, Use{PromptTokens: prompt, CompletionTokens: completion})
	return s.Settled, err
}

func status(t *testing.T, c *Counter, lim Limit) Used {
	t.Helper()
	s, err := c.Status(context.Background(), "acme", lim)
	if err != nil {
		t.Fatal(err)
	}
	return s.Used
}

func TestReserveChargesTheBoundAndSettleReplacesIt(t *testing.T) {
	c, _ := newCounter(t, nil)
	ctx := context.Background()
	lim := Limit{Tokens: 1000, Micros: 5000}
	d, err := c.Reserve(ctx, charge("r1", 100, 200), lim)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Used != (Used{Tokens: 300, Micros: 500}) || d.Reservation == "" {
		t.Fatalf("decision %+v, want allowed with 300 tokens and 500 micros used", d)
	}
	if want := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC); !d.ResetsAt.Equal(want) {
		t.Fatalf("resets at %s, want %s", d.ResetsAt, want)
	}
	ok, err := settle(ctx, c, d.Reservation, 90, 50)
	if err != nil || !ok {
		t.Fatalf("settle: %v, %v", ok, err)
	}
	if u := status(t, c, lim); u != (Used{Tokens: 140, Micros: 190}) {
		t.Fatalf("used %+v after settling 90+50 tokens, want 140 tokens and 190 micros", u)
	}
	// Exactly once: a retried settle changes nothing.
	if ok, err := settle(ctx, c, d.Reservation, 90, 50); err != nil || ok {
		t.Fatalf("second settle: %v, %v; want nothing settled", ok, err)
	}
	if u := status(t, c, lim); u != (Used{Tokens: 140, Micros: 190}) {
		t.Fatalf("used %+v after a second settle, want it unchanged", u)
	}
}

func TestReserveRefusesWhatWouldPassALimit(t *testing.T) {
	c, _ := newCounter(t, nil)
	ctx := context.Background()
	lim := Limit{Tokens: 1000}
	if d, err := c.Reserve(ctx, charge("r1", 400, 400), lim); err != nil || !d.Allowed {
		t.Fatalf("first: %+v, %v", d, err)
	}
	d, err := c.Reserve(ctx, charge("r2", 100, 150), lim)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Refused != KindTokens || d.Reservation != "" || d.Used.Tokens != 800 {
		t.Fatalf("decision %+v, want refused on tokens with 800 used and nothing charged", d)
	}
	// A charge that fits exactly passes.
	if d, err := c.Reserve(ctx, charge("r3", 100, 100), lim); err != nil || !d.Allowed || d.Used.Tokens != 1000 {
		t.Fatalf("exact fit: %+v, %v", d, err)
	}
	// Spend refuses on its own.
	spend := Limit{Micros: 100}
	c2, _ := newCounter(t, nil)
	d, err = c2.Reserve(ctx, Charge{Tenant: "other", RequestID: "s1", PromptTokens: 10, OutputTokens: 50, Price: price}, spend)
	if err != nil || d.Allowed || d.Refused != KindSpend {
		t.Fatalf("spend: %+v, %v; want refused on spend (110 micros > 100)", d, err)
	}
}

func TestGivingBackRestoresTheBudget(t *testing.T) {
	c, _ := newCounter(t, nil)
	ctx := context.Background()
	lim := Limit{Tokens: 500}
	d, err := c.Reserve(ctx, charge("r1", 200, 300), lim)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	if d, _ := c.Reserve(ctx, charge("r2", 1, 0), lim); d.Allowed {
		t.Fatal("the budget is full, yet a request passed")
	}
	if ok, err := settle(ctx, c, d.Reservation, 0, 0); err != nil || !ok {
		t.Fatalf("give back: %v, %v", ok, err)
	}
	if d, err := c.Reserve(ctx, charge("r3", 200, 300), lim); err != nil || !d.Allowed {
		t.Fatalf("after the give-back: %+v, %v", d, err)
	}
}

func TestTheSameRequestIsChargedOnce(t *testing.T) {
	c, _ := newCounter(t, nil)
	ctx := context.Background()
	lim := Limit{Tokens: 1000}
	for range 2 {
		d, err := c.Reserve(ctx, charge("r1", 100, 100), lim)
		if err != nil || !d.Allowed || d.Used.Tokens != 200 {
			t.Fatalf("%+v, %v; want 200 used after either call", d, err)
		}
	}
}

func TestWarnsOnceAtEightyPercent(t *testing.T) {
	c, _ := newCounter(t, nil)
	ctx := context.Background()
	lim := Limit{Tokens: 1000, Micros: 1_000_000}
	var warned []string
	for i, n := range []int64{700, 100, 100} {
		d, err := c.Reserve(ctx, charge(string(rune('a'+i)), n, 0), lim)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		warned = append(warned, d.Warn...)
		if i == 1 && !slices.Equal(d.Warn, []string{KindTokens}) {
			t.Fatalf("crossing 80%% of the tokens warned %v, want [tokens]", d.Warn)
		}
	}
	if !slices.Equal(warned, []string{KindTokens}) {
		t.Fatalf("warnings %v, want one tokens warning in the month", warned)
	}
}

func TestNoLimitCallsNothing(t *testing.T) {
	c, rdb := newCounter(t, nil)
	d, err := c.Reserve(context.Background(), charge("r1", 100, 100), Limit{})
	if err != nil || !d.Allowed || d.Reservation != "" {
		t.Fatalf("%+v, %v", d, err)
	}
	if n, _ := rdb.Exists(context.Background(), c.key("acme", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))).Result(); n != 0 {
		t.Fatal("a tenant without a budget got a counter")
	}
}

// A counter Redis lost is rebuilt from the ledger, once however many
// requests race to it, and the requests that were running when it was
// lost add what they used when they settle, once.
func TestRebuildsALostCounterFromTheLedgerOnce(t *testing.T) {
	var reads atomic.Int32
	ledger := Used{Tokens: 900, Micros: 1200}
	rebuild := func(ctx context.Context, tenant string, from, to time.Time) (Used, error) {
		reads.Add(1)
		if tenant != "acme" || !from.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) || !to.Equal(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("rebuild read %s over [%s, %s), want acme's December", tenant, from, to)
		}
		time.Sleep(20 * time.Millisecond) // let the racers all find it missing
		return ledger, nil
	}
	c, rdb := newCounter(t, rebuild)
	ctx := context.Background()
	lim := Limit{Tokens: 2000}
	running, err := c.Reserve(ctx, charge("running", 10, 40), lim)
	if err != nil || !running.Allowed {
		t.Fatalf("%+v, %v", running, err)
	}
	// Redis restarts empty.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	reads.Store(0)
	var wg sync.WaitGroup
	used := make([]int64, 8)
	for i := range used {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := c.Reserve(ctx, charge("after"+string(rune('0'+i)), 10, 0), lim)
			if err != nil || !d.Allowed {
				t.Errorf("%+v, %v", d, err)
			}
			used[i] = d.Used.Tokens
		}()
	}
	wg.Wait()
	if n := reads.Load(); n < 1 {
		t.Fatal("the ledger was never read")
	}
	if u := status(t, c, lim); u.Tokens != 900+8*10 {
		t.Fatalf("used %d after the rebuild and 8 requests, want 980: the ledger counted once", u.Tokens)
	}
	// The request that was running settles into the rebuilt counter: its
	// usage is not in the ledger yet (it is recorded after settling).
	if ok, err := settle(ctx, c, running.Reservation, 10, 20); err != nil || !ok {
		t.Fatalf("settle across the loss: %v, %v", ok, err)
	}
	if ok, err := settle(ctx, c, running.Reservation, 10, 20); err != nil || ok {
		t.Fatalf("second settle across the loss: %v, %v; want nothing", ok, err)
	}
	if u := status(t, c, lim); u.Tokens != 980+30 {
		t.Fatalf("used %d, want 1010", u.Tokens)
	}
}

func TestRebuildFailureIsAnError(t *testing.T) {
	c, _ := newCounter(t, func(context.Context, string, time.Time, time.Time) (Used, error) {
		return Used{}, errors.New("ledger down")
	})
	if _, err := c.Reserve(context.Background(), charge("r1", 1, 1), Limit{Tokens: 10}); err == nil {
		t.Fatal("a counter that could not be rebuilt let the request through")
	}
}

func TestSettleRejectsWhatIsNoReservation(t *testing.T) {
	c, _ := newCounter(t, nil)
	if _, err := settle(context.Background(), c, "r1\nsomething", 1, 1); err == nil {
		t.Fatal("settled a rate-limit reservation as a budget one")
	}
	if ok, err := settle(context.Background(), c, "", 1, 1); ok || err != nil {
		t.Fatalf("empty reservation: %v, %v", ok, err)
	}
}

func TestPriceMicros(t *testing.T) {
	// $0.15 and $0.60 per million tokens.
	p := Price{Input: 0.15, Output: 0.6}
	if got := p.Micros(1_000_000, 1_000_000); got != 750_000 {
		t.Fatalf("a million of each costs %d micros, want 750000", got)
	}
	if got := MicrosOf(12.5); got != 12_500_000 {
		t.Fatalf("MicrosOf(12.5) = %d", got)
	}
}

// Concurrent requests never charge past the limit together: of 50 racing
// for a budget that holds 10 of them, exactly 10 pass.
func TestConcurrentReservesNeverPassTheLimit(t *testing.T) {
	c, _ := newCounter(t, nil)
	lim := Limit{Tokens: 1000}
	var passed atomic.Int32
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := c.Reserve(context.Background(), charge("c"+strconv.Itoa(i), 60, 40), lim)
			if err != nil {
				t.Error(err)
			}
			if d.Allowed {
				passed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := passed.Load(); n != 10 {
		t.Fatalf("%d of 50 passed a budget that holds 10", n)
	}
	if u := status(t, c, lim); u.Tokens != 1000 {
		t.Fatalf("used %d, want 1000", u.Tokens)
	}
}

// A request that used more than was reserved for it is charged all of
// it (the month counts what the ledger will), and the settlement says by
// how much it overran, for its caller to report.
func TestSettleChargesUsageOverTheReservationAndReportsIt(t *testing.T) {
	c, _ := newCounter(t, nil)
	ctx := context.Background()
	lim := Limit{Tokens: 1000}
	d, err := c.Reserve(ctx, charge("r1", 100, 200), lim)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	s, err := c.Settle(ctx, d.Reservation, Use{PromptTokens: 1250, CompletionTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	// 1450 tokens (1250 + 400 micros) used, 300 (500 micros) reserved.
	if want := (Settlement{Settled: true, Tenant: "acme", OverTokens: 1150, OverMicros: 1150}); s != want {
		t.Fatalf("settlement %+v, want %+v", s, want)
	}
	if u := status(t, c, lim); u != (Used{Tokens: 1450, Micros: 1650}) {
		t.Fatalf("used %+v, want all 1450 tokens and 1650 micros charged", u)
	}
	if d, _ := c.Reserve(ctx, charge("r2", 1, 0), lim); d.Allowed {
		t.Fatal("a month past its limit took another request")
	}
	// Within the reservation: no overrun.
	d, _ = c.Reserve(ctx, charge("r3", 1, 0), Limit{Tokens: 10000})
	if s, err := c.Settle(ctx, d.Reservation, Use{PromptTokens: 1}); err != nil || s.OverTokens != 0 || s.OverMicros != 0 {
		t.Fatalf("settlement %+v, %v: want no overrun", s, err)
	}
}

// Concurrent requests each reserved their bound, all open at once, then
// all settling at most what they reserved: the month ends within its
// limit however they interleave.
func TestConcurrentRequestsSettlingWithinTheirReservationsStayWithinTheLimit(t *testing.T) {
	c, _ := newCounter(t, nil)
	ctx := context.Background()
	lim := Limit{Tokens: 10000}
	var wg sync.WaitGroup
	var admitted atomic.Int32
	reservations := make([]string, 40)
	for i := range reservations {
		wg.Go(func() {
			d, err := c.Reserve(ctx, charge("r"+strconv.Itoa(i), 1445+20, 64), lim)
			if err == nil && d.Allowed {
				admitted.Add(1)
				reservations[i] = d.Reservation
			}
		})
	}
	wg.Wait()
	for _, r := range reservations {
		wg.Go(func() {
			if _, err := c.Settle(ctx, r, Use{PromptTokens: 1445 + 20, CompletionTokens: 64}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if u := status(t, c, lim); u.Tokens > lim.Tokens || admitted.Load() != 6 {
		t.Fatalf("%d requests admitted, month at %d tokens: want 6 within the %d limit", admitted.Load(), u.Tokens, lim.Tokens)
	}
}
