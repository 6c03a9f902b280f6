package api

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/policy"
)

// An address that keeps guessing keys is banned on every server sharing
// the Redis: every route answers 429 with the ban's remaining time as
// Retry-After, until an admin lifts it. Its requests with no key at all
// (anonymous callers are allowed here) were never counted.
func TestGuessingIPIsBannedOnEveryServer(t *testing.T) {
	a, _, _ := newBannedServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" }, nil)
	b, _, _ := newBannedServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" }, nil)
	const flooder = "203.0.113.7"
	for i := range 20 {
		if rec := from(a, flooder, "", "GET", probe, ""); rec.Code != http.StatusNotFound {
			t.Fatalf("anonymous request %d: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	// Five strikes are the threshold; the sixth bans.
	for i := range 6 {
		assertJSONError(t, from(a, flooder, "sk-guess-"+strconv.Itoa(i), "GET", probe, ""), 401, "unauthorized")
	}
	rec := from(b, flooder, "", "GET", probe, "")
	assertJSONError(t, rec, 429, "banned")
	if got := rec.Header().Get("Retry-After"); got != "3" {
		t.Fatalf("Retry-After %q, want 3 (the ban's duration)", got)
	}
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/chat", `{"query":"hi"}`},
		{"GET", "/v1/kb", ""},
		{"GET", "/v1/sessions/s1", ""},
		{"DELETE", probe, ""},
		{"GET", "/v1/admin/queue", ""}, // with no key at all: counted, and refused
	} {
		rec := from(a, flooder, "", r.method, r.path, r.body)
		assertJSONError(t, rec, 429, "banned")
		if s, _ := strconv.Atoi(rec.Header().Get("Retry-After")); s < 1 || s > 3 {
			t.Fatalf("%s %s: Retry-After %q", r.method, r.path, rec.Header().Get("Retry-After"))
		}
	}
	// The OpenAI endpoint refuses in OpenAI's shape.
	rec = from(b, flooder, "", "POST", "/v1/chat/completions", `{"model":"sluice-sim","messages":[{"role":"user","content":"hi"}]}`)
	var oai struct {
		Error struct{ Type, Code string }
	}
	if _ = json.Unmarshal(rec.Body.Bytes(), &oai); rec.Code != 429 || oai.Error.Code != "banned" || oai.Error.Type != "rate_limit_error" {
		t.Fatalf("OpenAI endpoint: %d %s", rec.Code, rec.Body)
	}
	// Another address is not concerned.
	if rec := from(b, "203.0.113.8", "", "GET", probe, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("another ip: %d %s", rec.Code, rec.Body)
	}

	// The list names the address by its keyed hash, never as it is.
	list := admin(b, "GET", "/v1/admin/bans", "root", "")
	hash := iphash.New(nil).Of(flooder)
	if list.Code != 200 || !strings.Contains(list.Body.String(), `"kind":"ip","value":"`+hash+`"`) || !strings.Contains(list.Body.String(), `"remaining_s":`) ||
		strings.Contains(list.Body.String(), flooder) {
		t.Fatalf("bans: %d %s", list.Code, list.Body)
	}
	assertJSONError(t, admin(b, "DELETE", "/v1/admin/bans/ip/not-an-ip", "root", ""), 400, "bad_ban")
	// A hash of the list's form names a client too.
	assertJSONError(t, admin(b, "DELETE", "/v1/admin/bans/ip/"+iphash.New(nil).Of("198.51.100.1"), "root", ""), 404, "not_found")
	assertJSONError(t, admin(b, "DELETE", "/v1/admin/bans/user/x", "root", ""), 400, "bad_ban")
	assertJSONError(t, admin(b, "DELETE", "/v1/admin/bans/ip/198.51.100.1", "root", ""), 404, "not_found")
	if rec := admin(b, "DELETE", "/v1/admin/bans/ip/"+flooder, "root", ""); rec.Code != 200 {
		t.Fatalf("lift: %d %s", rec.Code, rec.Body)
	}
	if rec := from(a, flooder, "", "GET", probe, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("after the lift: %d %s", rec.Code, rec.Body)
	}

	// Counted on the server that imposed the ban and on each that refused;
	// no label names the address.
	mrec := httptest.NewRecorder()
	a.Handler().ServeHTTP(mrec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`sluice_banned_requests_total{kind="ip"} 5`, `sluice_bans_total{kind="ip"} 1`} {
		if !strings.Contains(mrec.Body.String(), want) {
			t.Errorf("/metrics of a lacks %s", want)
		}
	}
	mrec = httptest.NewRecorder()
	b.Handler().ServeHTTP(mrec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(mrec.Body.String(), `sluice_banned_requests_total{kind="ip"} 2`) || strings.Contains(mrec.Body.String(), flooder) {
		t.Errorf("/metrics of b: want two banned requests and no address:\n%s", grepLines(mrec.Body.String(), "ban"))
	}
}

// A key that keeps coming back while told to wait is banned, first from
// the address it hammers from, then from any address; its id names the
// ban. A key that waits as told is never banned.
func TestKeyIgnoringItsRetryAfterIsBanned(t *testing.T) {
	srv, rdb, prefix := newBannedServer(t, func(c *config.Config) {
		c.Auth.AdminKey = "root"
		c.Limits.Enabled = true
		tier := c.Limits.Tiers["standard"]
		tier.Routes.Reads = policy.RouteRate{TenantPerMinute: 2, IPPerMinute: 1000}
		c.Limits.Tiers["standard"] = tier
	}, nil)
	withManagedKeys(t, srv, rdb, prefix)
	k := createKey(t, srv, "root", `{"tenant":"acme","tier":"standard"}`)
	for i := range 2 {
		authenticated(t, from(srv, "198.51.100.1", k.Key, "GET", probe, ""))
		_ = i
	}
	first := from(srv, "198.51.100.1", k.Key, "GET", probe, "")
	assertJSONError(t, first, 429, "rate_limited")
	if s, _ := strconv.Atoi(first.Header().Get("Retry-After")); s < 10 {
		t.Fatalf("Retry-After %q: the test needs a long one", first.Header().Get("Retry-After"))
	}
	time.Sleep(testBanGrace + 10*time.Millisecond)
	// Five strikes are the threshold: the address and the key earn one
	// each per request; the sixth bans the address.
	for i := range 6 {
		assertJSONError(t, from(srv, "198.51.100.1", k.Key, "GET", probe, ""), 429, "rate_limited")
		_ = i
	}
	assertJSONError(t, from(srv, "198.51.100.1", k.Key, "GET", probe, ""), 429, "banned")
	// From a new address the key strikes once more, and is banned too.
	assertJSONError(t, from(srv, "198.51.100.2", k.Key, "GET", probe, ""), 429, "rate_limited")
	rec := from(srv, "198.51.100.3", k.Key, "GET", probe, "")
	assertJSONError(t, rec, 429, "banned")
	if !strings.Contains(rec.Body.String(), "API key") {
		t.Fatalf("want the key named banned: %s", rec.Body)
	}
	list := admin(srv, "GET", "/v1/admin/bans", "root", "")
	if !strings.Contains(list.Body.String(), `"kind":"key","value":"`+k.ID+`"`) {
		t.Fatalf("bans: %s", list.Body)
	}
	// A guess at the key (its id with a wrong secret) counts against the
	// guesser's address, not the key.
	if rec := admin(srv, "DELETE", "/v1/admin/bans/key/"+k.ID, "root", ""); rec.Code != 200 {
		t.Fatalf("lift: %d %s", rec.Code, rec.Body)
	}
	guess := k.Key[:len(k.Key)-4] + "aaaa"
	for range 6 {
		assertJSONError(t, from(srv, "198.51.100.200", guess, "GET", probe, ""), 401, "unauthorized")
	}
	assertJSONError(t, from(srv, "198.51.100.200", guess, "GET", probe, ""), 429, "banned")
	if rec := from(srv, "198.51.100.201", k.Key, "GET", probe, ""); rec.Code == 429 && strings.Contains(rec.Body.String(), "banned") {
		t.Fatalf("the key was banned for its guesser: %s", rec.Body)
	}
}

// Keys of every tier at their plan's full rate earn no strike, however
// busy, so no ban setting can contradict the tiers: the server's bans are
// the shipped ones (config.Default, built as the process builds them).
// Every tier's reads, resumes and chat are walked from fresh buckets to
// their edge: as many requests as the plan lets one address send, and,
// where the tenant's or the key's own rate is higher than one address's,
// as many as it lets the key send from addresses of their own (a tier
// with no per-address limit is walked at its tenant's rate). Each walk
// ends with one request past the edge, refused: that proves the walk
// reached it, and a client's first refusal is not a strike either. No
// strike counted at all, not merely no ban, is the check: the shipped
// threshold (50 strikes in 10 s) and grace (a second) only decide what
// strikes add up to, and within a plan there are none to add.
func TestBusyKeysWithinTheirPlanAreNeverBanned(t *testing.T) {
	srv, sc, rdb, prefix := shippedBansServer(t)
	shipped := config.Default()
	addr := 0
	nextIP := func() string {
		addr++
		return "10." + strconv.Itoa(addr>>16&255) + "." + strconv.Itoa(addr>>8&255) + "." + strconv.Itoa(addr&255)
	}
	for _, name := range slices.Sorted(maps.Keys(shipped.Limits.Tiers)) {
		tier := shipped.Limits.Tiers[name]
		for _, route := range busyRoutes(tier) {
			perKey := minLimit(route.tenant, route.user)
			walks := []struct {
				how        string
				n          int
				oneAddress bool
			}{{"from one address", minLimit(route.tenant, route.user, route.ip), true}}
			if route.ip > 0 && perKey > int(route.ip) {
				walks = append(walks, struct {
					how        string
					n          int
					oneAddress bool
				}{"from an address each", perKey, false})
			}
			for _, w := range walks {
				if w.n == 0 {
					t.Fatalf("tier %s, %s: no limit to walk to", name, route.name)
				}
				tenant := "busy-" + name + "-" + route.name + "-" + strconv.FormatBool(w.oneAddress)
				k := createKey(t, srv, "root", `{"tenant":"`+tenant+`","tier":"`+name+`","scopes":["chat"]}`)
				ip := nextIP()
				start := time.Now()
				n := w.n
				for i := 0; i < n; i++ {
					if !w.oneAddress {
						ip = nextIP()
					}
					rec := sc.send(srv, ip, k.Key, route.method, route.path, route.body)
					if i == 0 && route.tokens > 0 {
						// A chat request reserves tokens too: the plan's
						// edge is the first of its two rates to run out.
						if cost := tokenCost(rec); cost > 0 && route.tokens/cost < n {
							n = route.tokens / cost
						}
					}
					if rec.Code != route.admitted {
						t.Fatalf("tier %s, %s %s, request %d of the %d its plan allows: %d %s, want %d", name, route.name, w.how, i+1, n, rec.Code, rec.Body, route.admitted)
					}
				}
				// Past the edge: refused, once what the buckets refill
				// meanwhile (n a minute) is spent too.
				refilled := func() int { return int(time.Since(start).Minutes()*float64(n)) + 1 }
				past := 0
				for ; past <= refilled(); past++ {
					if !w.oneAddress {
						ip = nextIP()
					}
					if rec := sc.send(srv, ip, k.Key, route.method, route.path, route.body); rec.Code == http.StatusTooManyRequests && strings.Contains(rec.Body.String(), "rate_limited") {
						break
					}
				}
				if past > refilled() {
					t.Fatalf("tier %s, %s %s: %d requests past the plan's %d admitted (%d refilled); the walk did not reach the edge", name, route.name, w.how, past, n, refilled())
				}
				t.Logf("tier %s, %s %s: %d requests admitted, refused %d past them (%s)", name, route.name, w.how, n, past+1, time.Since(start).Round(time.Millisecond))
			}
		}
	}
	if strikes, err := rdb.Keys(context.Background(), prefix+"ban:*:n").Result(); err != nil || len(strikes) > 0 {
		t.Fatalf("strikes counted after every tier's full rate: %v %v", strikes, err)
	}
	if list := admin(srv, "GET", "/v1/admin/bans", "root", ""); list.Code != 200 || strings.Contains(list.Body.String(), `"kind"`) {
		t.Fatalf("bans after every tier's full rate: %d %s", list.Code, list.Body)
	}
}

// busyRoute is one route a busy key uses, with its tier's rates on it.
type busyRoute struct {
	name, method, path, body string
	// admitted is its answer to a request let in.
	admitted int
	// Requests a minute per tenant, key user and address (0: no limit),
	// and the fewest tokens a minute of tenant and user (0: none).
	tenant, user, ip float64
	tokens           int
}

func busyRoutes(tier policy.Tier) []busyRoute {
	return []busyRoute{
		{name: "reads", method: "GET", path: probe, admitted: http.StatusNotFound,
			tenant: tier.Routes.Reads.TenantPerMinute, ip: tier.Routes.Reads.IPPerMinute},
		{name: "resumes", method: "GET", path: probe + "/events", admitted: http.StatusNotFound,
			tenant: tier.Routes.Resumes.TenantPerMinute, ip: tier.Routes.Resumes.IPPerMinute},
		{name: "chat", method: "POST", path: "/v1/chat", body: `{"query":"hello","max_tokens":8}`, admitted: http.StatusOK,
			tenant: float64(tier.Tenant.RequestsPerMinute), user: float64(tier.User.RequestsPerMinute), ip: float64(tier.IP.RequestsPerMinute),
			tokens: minLimit(float64(tier.Tenant.TokensPerMinute), float64(tier.User.TokensPerMinute))},
	}
}

// minLimit is the smallest of the rates that are set (> 0); 0 if none is.
func minLimit(rates ...float64) int {
	out := 0
	for _, r := range rates {
		if r > 0 && (out == 0 || int(r) < out) {
			out = int(r)
		}
	}
	return out
}

// tokenCost is what an admitted chat request reserved of its tokens limit.
func tokenCost(rec *httptest.ResponseRecorder) int {
	limit, _ := strconv.Atoi(rec.Header().Get("X-Ratelimit-Limit-Tokens"))
	left, _ := strconv.Atoi(rec.Header().Get("X-Ratelimit-Remaining-Tokens"))
	return limit - left
}

// shippedBansServer is a server with the shipped limits and bans, the
// guard built from config.Default as the process builds it, whose chat
// requests start (startingClient).
func shippedBansServer(t *testing.T) (*Server, *startingClient, *redis.Client, string) {
	t.Helper()
	var prefix string
	var sc *startingClient
	srv, _, rdb := newTestServerWith(t, func(c *config.Config) {
		c.Auth.AdminKey = "root"
	}, func(rdb *redis.Client, o *Options) {
		prefix = sharedPrefix(t, rdb)
		var err error
		if o.Bans, err = ban.New(rdb, config.Default().Limits.Ban.GuardOptions(prefix, o.Addresses)); err != nil {
			t.Fatal(err)
		}
		sc = &startingClient{countingClient: o.Temporal.(*countingClient)}
		o.Temporal = sc
	})
	withManagedKeys(t, srv, rdb, prefix)
	return srv, sc, rdb, prefix
}

// startingClient starts every workflow (as a server that took the start
// would), so that a chat request keeps what it was charged; the client
// that sent it leaves once it has started (send).
type startingClient struct{ *countingClient }

// leaveKey holds, in a request's context, how its client leaves.
type leaveKey struct{}

func (c *startingClient) ExecuteWorkflow(ctx context.Context, o client.StartWorkflowOptions, _ any, _ ...any) (client.WorkflowRun, error) {
	c.starts.Add(1)
	if leave, ok := ctx.Value(leaveKey{}).(context.CancelFunc); ok {
		leave()
	}
	return startedRun{id: o.ID}, nil
}

type startedRun struct {
	client.WorkflowRun
	id string
}

func (r startedRun) GetID() string    { return r.id }
func (r startedRun) GetRunID() string { return r.id + "-run" }

// send is from for a client that leaves once its request has started.
func (c *startingClient) send(srv *Server, ip, key, method, path, body string) *httptest.ResponseRecorder {
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	req := httptest.NewRequest(method, path, strings.NewReader(body)).WithContext(context.WithValue(ctx, leaveKey{}, leave))
	req.RemoteAddr = ip + ":40000"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}

// Whatever happens to a key — created, used, guessed at, banned, revoked,
// used revoked — no log line and no metric holds it.
func TestLogsNeverHoldAPlainKey(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, rdb, prefix := newBannedServer(t, func(c *config.Config) { c.Auth.AdminKey = "root" }, func(o *Options) { o.Logger = logger })
	withManagedKeys(t, srv, rdb, prefix)

	k := createKey(t, srv, "root", `{"tenant":"acme","scopes":["chat","ingest"]}`)
	secret := k.Key[strings.LastIndex(k.Key, "_")+1:]
	from(srv, "198.51.100.1", k.Key, "POST", "/v1/chat", `{"query":"hello","max_tokens":8}`)
	from(srv, "198.51.100.1", k.Key[:len(k.Key)-1]+"x", "GET", probe, "")
	for range 7 {
		from(srv, "198.51.100.2", k.Key, "GET", probe, "")
		from(srv, "198.51.100.3", "k-acme", "GET", probe, "")
		from(srv, "198.51.100.5", k.Key[:len(k.Key)-2]+"yy", "GET", probe, "")
	}
	admin(srv, "GET", "/v1/admin/keys", "root", "")
	admin(srv, "DELETE", "/v1/admin/keys/"+k.ID, "root", "")
	from(srv, "198.51.100.4", k.Key, "GET", probe, "")
	srv.keyCache.Forget(k.ID)

	out := logs.String()
	for _, want := range []string{"API key created", "banned for abuse", "API key revoked", k.ID} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	mrec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(mrec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for where, text := range map[string]string{"logs": out, "metrics": mrec.Body.String()} {
		for _, secretish := range []string{k.Key, secret, secret[:16], "k-acme", "root"} {
			if strings.Contains(text, secretish) {
				t.Errorf("%s hold %q:\n%s", where, secretish, grepLines(text, secretish))
			}
		}
	}
}

func grepLines(text, word string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, word) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// A client behind a trusted proxy is banned by the address the proxy
// names, whatever that is: one that writes X-Forwarded-For: 127.0.0.1
// while guessing keys is banned like anyone, though loopback is exempt
// (limits.ban.exempt, the default); the exemption is a connection's own
// address's, which a direct loopback client keeps. A connection outside
// the trusted proxies cannot name anyone: its guesses are counted against
// its own address, and the address it wrote is not concerned.
func TestForwardedLoopbackIsBannedLikeAnyone(t *testing.T) {
	const proxy, outsider, victim = "203.0.113.10", "10.244.1.5", "198.51.100.9"
	srv, _, _ := newBannedServer(t, func(c *config.Config) { c.API.TrustedProxies = []string{"203.0.113.0/24"} }, func(o *Options) {
		g, err := ban.New(o.Redis, ban.Options{KeyPrefix: sharedPrefix(t, o.Redis.(*redis.Client)), Threshold: 5, Window: 10 * time.Second,
			Duration: 3 * time.Second, Grace: testBanGrace, Exempt: config.Default().Limits.Ban.ExemptPrefixes()})
		if err != nil {
			t.Fatal(err)
		}
		o.Bans = g
	})
	// Five strikes are the threshold; the sixth bans.
	for i := range 6 {
		assertJSONError(t, forwarded(srv, proxy, "127.0.0.1", "sk-guess-"+strconv.Itoa(i)), 401, "unauthorized")
	}
	assertJSONError(t, forwarded(srv, proxy, "127.0.0.1", ""), 429, "banned")
	if rec := forwarded(srv, proxy, victim, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("another client of the proxy: %d %s", rec.Code, rec.Body)
	}
	for range 7 {
		assertJSONError(t, from(srv, "127.0.0.1", "sk-guess-direct", "GET", probe, ""), 401, "unauthorized")
	}

	for i := range 6 {
		assertJSONError(t, forwarded(srv, outsider, victim, "sk-guess-"+strconv.Itoa(i)), 401, "unauthorized")
	}
	assertJSONError(t, from(srv, outsider, "", "GET", probe, ""), 429, "banned")
	if rec := forwarded(srv, proxy, victim, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("the client an outsider named: %d %s", rec.Code, rec.Body)
	}
}

// forwarded sends a probe with key ("" for none) over a connection from
// peer that names client in X-Forwarded-For.
func forwarded(srv *Server, peer, client, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", probe, nil)
	req.RemoteAddr = peer + ":40000"
	req.Header.Set("X-Forwarded-For", client)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}
