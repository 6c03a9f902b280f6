package ban

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/tests/testenv"
)

var srv *testenv.Redis

func TestMain(m *testing.M) {
	os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r }))
}

func newGuard(t *testing.T, opts Options) *Guard {
	t.Helper()
	opts.KeyPrefix = testenv.KeyPrefix(t)
	rdb := srv.Client(t)
	// Bans outlive a test; a rerun (-count) starts from none.
	if old, _ := rdb.Keys(context.Background(), opts.KeyPrefix+"*").Result(); len(old) > 0 {
		rdb.Del(context.Background(), old...)
	}
	g, err := New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// More than the threshold within the window bans the subject for the
// ban's duration; every later request learns what is left of it.
func TestFloodIsBannedForItsDuration(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, Options{Threshold: 5, Window: 10 * time.Second, Duration: 300 * time.Millisecond})
	ip := g.IP("203.0.113.9")
	for i := range 5 {
		if v, err := g.Strike(ctx, ip); err != nil || v.Banned {
			t.Fatalf("request %d: %+v %v", i+1, v, err)
		}
	}
	v, err := g.Strike(ctx, ip)
	if err != nil || !v.Banned || !v.New || v.Kind != KindIP || v.Value != iphash.New(nil).Of("203.0.113.9") || v.RetryAfter != 300*time.Millisecond {
		t.Fatalf("sixth request: %+v %v", v, err)
	}
	v, _ = g.Strike(ctx, ip)
	if !v.Banned || v.New || v.RetryAfter <= 0 || v.RetryAfter > 300*time.Millisecond {
		t.Fatalf("while banned: %+v", v)
	}
	// Another address is not concerned.
	if v, _ := g.Strike(ctx, g.IP("203.0.113.10")); v.Banned {
		t.Fatalf("another ip: %+v", v)
	}
	time.Sleep(350 * time.Millisecond)
	if v, _ := g.Strike(ctx, ip); v.Banned {
		t.Fatalf("after the ban: %+v (the counter must start again)", v)
	}
}

// A request counts against its IP and its key; a banned key is refused
// from any address, and the answer names what is banned.
func TestKeyAndIPAreCountedTogether(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, Options{Threshold: 3, Window: 10 * time.Second, Duration: time.Minute})
	key := Subject{Kind: KindKey, Value: "abcdefghijkl"}
	for i := range 3 {
		// From a new address each time: only the key is over.
		if v, _ := g.Strike(ctx, g.IP(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}).String()), key); v.Banned {
			t.Fatalf("request %d: %+v", i+1, v)
		}
	}
	v, _ := g.Strike(ctx, g.IP("198.51.100.200"), key)
	if !v.Banned || v.Kind != KindKey || v.Value != "abcdefghijkl" {
		t.Fatalf("fourth request: %+v", v)
	}
	bans, err := g.List(ctx)
	if err != nil || len(bans) != 1 || bans[0].Kind != KindKey || bans[0].Remaining <= 0 || bans[0].Since.IsZero() {
		t.Fatalf("List = %+v %v", bans, err)
	}
	if ok, err := g.Lift(ctx, key); !ok || err != nil {
		t.Fatalf("Lift = %v %v", ok, err)
	}
	if v, _ := g.Strike(ctx, g.IP("198.51.100.200"), key); v.Banned {
		t.Fatalf("after lift: %+v", v)
	}
	if bans, _ := g.List(ctx); len(bans) != 0 {
		t.Fatalf("after lift: %+v", bans)
	}
	if ok, _ := g.Lift(ctx, key); ok {
		t.Fatal("lifted a ban twice")
	}
}

// The window slides: a burst split across a window boundary is still
// seen, because the previous window's count weighs in.
func TestBurstAcrossAWindowBoundaryIsSeen(t *testing.T) {
	ctx := context.Background()
	const window = 400 * time.Millisecond
	g := newGuard(t, Options{Threshold: 10, Window: window, Duration: time.Minute})
	ip := g.IP("192.0.2.7")
	// Start just before a boundary on Redis's clock.
	now, err := srv.Client(t).Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	into := time.Duration(now.UnixMilli()%window.Milliseconds()) * time.Millisecond
	time.Sleep(window - into - 60*time.Millisecond)
	for range 8 {
		_, _ = g.Strike(ctx, ip)
	}
	time.Sleep(80 * time.Millisecond) // into the next window
	banned := false
	for range 8 {
		v, _ := g.Strike(ctx, ip)
		banned = banned || v.Banned
	}
	if !banned {
		t.Fatal("16 requests within ~100ms across a boundary were not banned at a threshold of 10")
	}
}

// Counting is atomic: of many concurrent requests exactly one imposes the
// ban, and exactly threshold are let through.
func TestConcurrentStrikesBanOnce(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, Options{Threshold: 20, Window: 10 * time.Second, Duration: time.Minute})
	ip := g.IP("192.0.2.8")
	var mu sync.Mutex
	var passed, imposed int
	var wg sync.WaitGroup
	for range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := g.Strike(ctx, ip)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if !v.Banned {
				passed++
			}
			if v.New {
				imposed++
			}
		}()
	}
	wg.Wait()
	if passed != 20 || imposed != 1 {
		t.Fatalf("%d passed, %d bans imposed; want 20 and 1", passed, imposed)
	}
}

func TestExemptAndIPv6Subjects(t *testing.T) {
	g := newGuard(t, Options{Threshold: 1, Window: time.Second, Duration: time.Second,
		Exempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}})
	for _, addr := range []string{"127.0.0.1", "::1", "::ffff:127.0.0.1", "not an ip", ""} {
		if s := g.IP(addr); s.Value != "" {
			t.Errorf("IP(%q) = %+v, want none", addr, s)
		}
	}
	if a, b := g.IP("2001:db8:1:2::1"), g.IP("2001:db8:1:2:ffff::9"); a != b || a.Value != iphash.New(nil).Of("2001:db8:1:2::") {
		t.Errorf("one /64: %+v %+v", a, b)
	}
	if v, err := g.Strike(context.Background(), g.IP("127.0.0.1"), Subject{}); v.Banned || err != nil {
		t.Errorf("nothing to count: %+v %v", v, err)
	}
}

// An address a trusted proxy named is never exempt: the exemption is for
// a connection's own address.
func TestForwardedAddressesAreNotExempt(t *testing.T) {
	g := newGuard(t, Options{Threshold: 1, Window: time.Second, Duration: time.Second,
		Exempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}})
	for _, addr := range []string{"127.0.0.1", "::1", "::ffff:127.0.0.1"} {
		if s, want := g.ForwardedIP(addr), g.addressSubject(netip.MustParseAddr(addr).Unmap()); s != want || s.Value == "" {
			t.Errorf("ForwardedIP(%q) = %+v, want %+v", addr, s, want)
		}
	}
	if s := g.ForwardedIP("not an ip"); s.Value != "" {
		t.Errorf("ForwardedIP of no address = %+v, want none", s)
	}
}

func TestParseSubject(t *testing.T) {
	g := newGuard(t, Options{Threshold: 1, Window: time.Second, Duration: time.Second, Addresses: iphash.New([]byte("test-ip-hash-key-0123"))})
	for _, tc := range []struct {
		kind, value string
		ok          bool
	}{
		{"ip", "203.0.113.9", true}, {"ip", "2001:db8::", true}, {"ip", "nope", false}, {"ip", "0123456789abcdef", true},
		{"ip", "0123456789ABCDEF", false}, {"key", "abcdefghijkl", true}, {"key", "a:b", false}, {"key", "", false}, {"user", "x", false},
	} {
		if _, err := g.ParseSubject(tc.kind, tc.value); (err == nil) != tc.ok {
			t.Errorf("ParseSubject(%q, %q) = %v", tc.kind, tc.value, err)
		}
	}
	// An operator names a client by its address or by the hash the list
	// shows, and means the subject Hit counted: an IPv6 one by its /64.
	for _, given := range []string{"2001:db8:1:2::77", g.IP("2001:db8:1:2::1").Value} {
		if s, err := g.ParseSubject("ip", given); err != nil || s != g.IP("2001:db8:1:2::1") {
			t.Errorf("ParseSubject(ip, %s) = %+v %v, want %+v", given, s, err, g.IP("2001:db8:1:2::1"))
		}
	}
}

// Addresses become key names and list entries only as their keyed hash.
func TestAddressesAreHashedInKeysAndList(t *testing.T) {
	ctx := context.Background()
	h := iphash.New([]byte("test-ip-hash-key-0123"))
	g := newGuard(t, Options{Threshold: 1, Window: 10 * time.Second, Duration: time.Minute, Addresses: h})
	ip := g.IP("198.51.100.23")
	if ip.Value != h.Of("198.51.100.23") || ip.Value == iphash.New(nil).Of("198.51.100.23") {
		t.Fatalf("subject %+v: not the configured key's hash", ip)
	}
	for range 2 {
		if _, err := g.Strike(ctx, ip); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := g.rdb.Keys(ctx, g.opts.KeyPrefix+"*").Result()
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys %v %v, want the ban and the index", keys, err)
	}
	for _, k := range keys {
		if strings.Contains(k, "198.51") {
			t.Errorf("key %s names the address", k)
		}
	}
	list, _ := g.List(ctx)
	if len(list) != 1 || list[0].Value != ip.Value {
		t.Fatalf("list %+v", list)
	}
	sub, _ := g.ParseSubject("ip", "198.51.100.23")
	if lifted, err := g.Lift(ctx, sub); err != nil || !lifted {
		t.Fatalf("lift by address: %t %v", lifted, err)
	}
}

// Counted one subject a call, as on a cluster: the ban is the same, and
// it is listed although the script did not write the index.
func TestBanOneSubjectACall(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, Options{Threshold: 2, Window: 10 * time.Second, Duration: time.Minute})
	g.splits = true
	ip, key := g.IP("203.0.113.9"), Subject{Kind: KindKey, Value: "abcdefghijkl"}
	for i := range 2 {
		if v, err := g.Strike(ctx, ip, key); err != nil || v.Banned {
			t.Fatalf("request %d: %+v %v", i+1, v, err)
		}
	}
	v, err := g.Strike(ctx, ip, key)
	if err != nil || !v.Banned || !v.New || v.Kind != KindIP {
		t.Fatalf("third request: %+v %v; want the ip banned", v, err)
	}
	list, err := g.List(ctx)
	if err != nil || len(list) != 1 || list[0].Kind != KindIP || list[0].Value != ip.Value {
		t.Fatalf("bans %+v %v, want the ip's", list, err)
	}
}

// Check reads the bans and counts nothing: any number of checks of a
// subject never bans it, and a ban in force is reported with what is left
// of it.
func TestCheckCountsNothing(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, Options{Threshold: 2, Window: 10 * time.Second, Duration: time.Minute})
	ip, key := g.IP("203.0.113.20"), Subject{Kind: KindKey, Value: "k1"}
	for range 50 {
		if v, err := g.Check(ctx, ip, key, Subject{}); err != nil || v.Banned {
			t.Fatalf("check: %+v %v", v, err)
		}
	}
	for range 3 {
		_, _ = g.Strike(ctx, key)
	}
	v, err := g.Check(ctx, ip, key)
	if err != nil || !v.Banned || v.Kind != KindKey || v.New || v.RetryAfter <= 0 || v.RetryAfter > time.Minute {
		t.Fatalf("check of a banned key: %+v %v", v, err)
	}
}

// A client that honours its Retry-After earns no strike however often it
// is refused, and neither does a burst refused all at once (its requests
// were on their way before the first refusal reached it).
func TestHonouredRetryAfterIsNeverAStrike(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, Options{Threshold: 3, Window: 10 * time.Second, Duration: time.Minute, Grace: 100 * time.Millisecond})
	ip := g.IP("203.0.113.21")
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := g.Refused(ctx, 150*time.Millisecond, ip); err != nil || v.Banned {
				t.Errorf("burst refusal: %+v %v", v, err)
			}
		}()
	}
	wg.Wait()
	for range 5 {
		time.Sleep(170 * time.Millisecond) // the Retry-After, and a little
		if v, err := g.Refused(ctx, 150*time.Millisecond, ip); err != nil || v.Banned {
			t.Fatalf("refusal after waiting as told: %+v %v", v, err)
		}
	}
}

// A client that comes back while told to wait earns a strike each time
// (after the grace), and is banned past the threshold; its key with it.
func TestIgnoredRetryAfterIsBanned(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, Options{Threshold: 3, Window: 10 * time.Second, Duration: time.Minute, Grace: 50 * time.Millisecond})
	ip, key := g.IP("203.0.113.22"), Subject{Kind: KindKey, Value: "k2"}
	if v, _ := g.Refused(ctx, 10*time.Second, ip, key); v.Banned {
		t.Fatalf("first refusal: %+v", v)
	}
	time.Sleep(60 * time.Millisecond)
	for i := range 3 {
		if v, _ := g.Refused(ctx, 10*time.Second, ip, key); v.Banned {
			t.Fatalf("strike %d of 3: %+v", i+1, v)
		}
	}
	v, err := g.Refused(ctx, 10*time.Second, ip, key)
	if err != nil || !v.Banned || !v.New || v.Kind != KindIP {
		t.Fatalf("fourth strike: %+v %v, want the address banned", v, err)
	}
	if v, _ := g.Check(ctx, key); !v.Banned {
		// The key struck as often, and is banned by the next refusal that
		// reaches its counter.
		if v, _ := g.Refused(ctx, 10*time.Second, key); !v.Banned {
			t.Fatalf("the key that ignored its Retry-After as often: %+v", v)
		}
	}
}
