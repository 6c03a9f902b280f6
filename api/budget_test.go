package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/pkg/usage"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// budgetServer is a server where acme's keys are on the "metered" tier,
// whose tenants may use tokensPerMonth tokens a month, and globex's on
// the default tier (no budget). Its ledger holds what acme used this month
// (ledgerTokens, prompt and completion alike) and its counters start
// empty, as after a Redis loss: the first request rebuilds acme's from
// the ledger.
func budgetServer(t *testing.T, tokensPerMonth int64, ledgerTokens int) (*Server, *countingClient) {
	t.Helper()
	srv, tc, _ := budgetServerWith(t, tokensPerMonth, ledgerTokens, func(*config.Config) {})
	return srv, tc
}

// budgetServerWith is budgetServer with its config changed by configure,
// and its budgets' counter.
func budgetServerWith(t *testing.T, tokensPerMonth int64, ledgerTokens int, configure func(*config.Config)) (*Server, *countingClient, *budget.Counter) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "usage.db")
	ledger, err := usage.OpenSQLite(context.Background(), usage.SQLiteOptions{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ledger.Close() })
	var counter *budget.Counter
	if ledgerTokens > 0 {
		e := usage.Entry{RequestID: "chat-earlier", Tenant: "acme", User: "alice", KeyID: "ka", Model: "sluice-sim", Pool: "short", Route: "short",
			PromptTokens: ledgerTokens / 2, CompletionTokens: ledgerTokens - ledgerTokens/2, Outcome: "done", FinishedAt: time.Now().UTC()}
		if _, err := ledger.Record(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	srv, tc, _ := newTestServerWith(t, func(c *config.Config) {
		tenantsConfig(c)
		c.Auth.APIKeys[0].Tier, c.Auth.APIKeys[1].Tier = "metered", "metered"
		c.Limits.Tiers["metered"] = policy.Tier{Weight: 1, Budget: policy.Budget{TokensPerMonth: tokensPerMonth}}
		c.Usage = config.Usage{Database: config.Database{Store: config.UsageSQLite, SQLitePath: path}}
		configure(c)
	}, func(rdb *redis.Client, o *Options) {
		o.Usage = ledger
		cfg := o.Config
		cfg.Redis.KeyPrefix = "t:" + t.Name() + ":"
		// As the process builds them: a month Redis lost is rebuilt
		// from the ledger (the tier's budget counts tokens, not spend).
		o.Budgets = budget.New(rdb, budget.Options{KeyPrefix: cfg.Redis.KeyPrefix,
			Rebuild: budget.FromLedger(ledger, budget.Prices{})})
		counter = o.Budgets
	})
	return srv, tc, counter
}

// A tenant whose month the ledger says is nearly spent is refused at the
// door, on both APIs, with 429 budget_exceeded naming the reset and a
// Retry-After to it, and nothing starts; another tenant is not refused.
func TestBudgetRefusesATenantOverItAndNotAnother(t *testing.T) {
	srv, tc := budgetServer(t, 2000, 1950)
	_, next := budget.Month(time.Now())
	reset := next.Format(time.RFC3339)

	rec := as(srv, keyAlice, "POST", "/v1/chat", `{"query":"how long do refunds take?","max_tokens":64}`)
	assertJSONError(t, rec, http.StatusTooManyRequests, "budget_exceeded")
	var body struct {
		Error refusal.Error `json:"error"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if !strings.Contains(body.Error.Message, reset) || !strings.Contains(body.Error.Message, "2000 tokens") || body.Error.Kind != "tokens" {
		t.Fatalf("refusal %+v: want it to name the 2000-token budget and the reset %s", body.Error, reset)
	}
	retry, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
	if until := time.Until(next); retry < int(until.Seconds())-5 || retry > int(until.Seconds())+5 {
		t.Fatalf("Retry-After %q, want about %.0f s (to %s)", rec.Header().Get("Retry-After"), until.Seconds(), reset)
	}
	if got := rec.Header().Get("X-Budget-Remaining-Tokens"); got != "50" || rec.Header().Get("X-Budget-Reset") != reset {
		t.Fatalf("budget headers: remaining %q reset %q, want 50 and %s", got, rec.Header().Get("X-Budget-Reset"), reset)
	}

	req := `{"model":"sluice-sim","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`
	rec = as(srv, keyAlice, "POST", "/v1/chat/completions", req)
	assertOpenAIError(t, rec, http.StatusTooManyRequests, "rate_limit_error", "budget_exceeded", "")
	if n := tc.starts.Load(); n != 0 {
		t.Fatalf("%d workflows started for a tenant over its budget", n)
	}
	if got := metricLines(srv, `sluice_requests_total{outcome="rejected_budget_exceeded"`); !strings.HasSuffix(got, "} 2") {
		t.Fatalf("refusals counted %q, want 2", got)
	}

	// globex has no budget: it reaches the start (which this test's
	// Temporal refuses), uncharged.
	rec = as(srv, keyGus, "POST", "/v1/chat", `{"query":"how long do refunds take?","max_tokens":64}`)
	if n := tc.starts.Load(); n != 1 {
		t.Fatalf("globex: %d starts, %d %s", n, rec.Code, rec.Body)
	}
	if in := tc.inputs[0]; in.Tenant != "globex" || in.BudgetReservation != "" {
		t.Fatalf("globex's request carried a budget charge: %+v", in)
	}
	if rec.Header().Get("X-Budget-Reset") != "" {
		t.Fatal("a tenant without a budget got budget headers")
	}

	// acme's own usage shows the month, rebuilt from the ledger.
	rec = as(srv, keyAlice, "GET", "/v1/usage", "")
	var u struct {
		Budget *struct {
			TokensLimit int64  `json:"tokens_limit"`
			TokensUsed  int64  `json:"tokens_used"`
			ResetsAt    string `json:"resets_at"`
		} `json:"budget"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &u); err != nil || rec.Code != 200 || u.Budget == nil {
		t.Fatalf("usage %d %s", rec.Code, rec.Body)
	}
	if u.Budget.TokensLimit != 2000 || u.Budget.TokensUsed != 1950 || u.Budget.ResetsAt != reset {
		t.Fatalf("budget %+v, want 1950 of 2000 used, resetting at %s", *u.Budget, reset)
	}
	if rec := as(srv, keyGus, "GET", "/v1/usage", ""); strings.Contains(rec.Body.String(), `"budget"`) {
		t.Fatalf("globex's usage shows a budget: %s", rec.Body)
	}
}

// A request charged to its budget that never starts gives the charge back.
func TestBudgetChargeOfARequestThatNeverStartedIsGivenBack(t *testing.T) {
	srv, tc := budgetServer(t, 100000, 0)
	rec := as(srv, keyAlice, "POST", "/v1/chat", `{"query":"how long do refunds take?","max_tokens":64}`)
	if tc.starts.Load() != 1 || rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("%d starts, %d %s; want the start tried and failed", tc.starts.Load(), rec.Code, rec.Body)
	}
	if tc.inputs[0].BudgetReservation == "" {
		t.Fatal("the started request carried no budget charge")
	}
	left, _ := strconv.Atoi(rec.Header().Get("X-Budget-Remaining-Tokens"))
	if left <= 0 || left >= 100000-64 {
		t.Fatalf("remaining %q after the charge, want the bound taken", rec.Header().Get("X-Budget-Remaining-Tokens"))
	}
	rec = as(srv, keyAlice, "GET", "/v1/usage", "")
	if !strings.Contains(rec.Body.String(), `"tokens_used":0`) {
		t.Fatalf("usage after the failed start: %s; want the charge given back", rec.Body)
	}
}

// The first request past 80 % of a month's budget counts one warning;
// later ones in the month do not (each request here fails to start and
// gives its charge back, so each crosses 80 % anew).
func TestBudgetWarnsOnceAtEightyPercent(t *testing.T) {
	srv, tc := budgetServer(t, 100000, 79900)
	for range 3 {
		as(srv, keyAlice, "POST", "/v1/chat", `{"query":"how long do refunds take?","max_tokens":64}`)
	}
	if n := tc.starts.Load(); n != 3 {
		t.Fatalf("%d starts, want 3: the budget holds them", n)
	}
	if got := metricLines(srv, "sluice_budget_warnings_total"); got != `sluice_budget_warnings_total{kind="tokens"} 1` {
		t.Fatalf("warnings:\n%s\nwant one tokens warning", got)
	}
}

// metricLines are the lines of the server's /metrics that start with prefix.
func metricLines(srv *Server, prefix string) string {
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	var out []string
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// An image sent inline is charged as OpenAI's tile-counting models count
// it, by the size its header gives: a large one its tiles (at most
// tokens.ImageMax), a small one a single tile, a low-detail one the fixed
// tokens.ImageLowDetail; an image the door cannot see the size of, the
// most an image can cost.
func TestBudgetChargesAnImageByItsSize(t *testing.T) {
	part := func(url, detail string) string {
		return `,{"type":"image_url","image_url":{"url":"` + url + `","detail":"` + detail + `"}}`
	}
	text := chargedFor(t, "")
	for name, tc := range map[string]struct {
		image string
		want  int
	}{
		"large":      {part(testenv.PNGDataURL(t, 3000, 1100), "high"), tokens.ImageMax},
		"square":     {part(testenv.PNGDataURL(t, 1024, 1024), "auto"), 765},
		"small":      {part(testenv.PNGDataURL(t, 200, 150), ""), 255},
		"low detail": {part(testenv.PNGDataURL(t, 3000, 1100), "low"), tokens.ImageLowDetail},
		"remote":     {part("https://example.com/cat.png", "high"), tokens.ImageMax},
	} {
		if got := chargedFor(t, tc.image) - text; got != tc.want {
			t.Errorf("%s image charged %d tokens, want %d", name, got, tc.want)
		}
	}
}

// chargedFor is what the door reserves of a 100,000-token month for an
// OpenAI request with a short text, the content part image (a JSON
// object after a comma, or "") and max_tokens 64.
func chargedFor(t *testing.T, image string) int {
	t.Helper()
	srv, tc, _ := budgetServerWith(t, 100000, 0, func(c *config.Config) { c.API.MaxBodyBytes = 64 << 10 })
	rec := as(srv, keyAlice, "POST", "/v1/chat/completions", imageRequest(image))
	if tc.starts.Load() != 1 {
		t.Fatalf("no start: %d %s", rec.Code, rec.Body)
	}
	left, err := strconv.Atoi(rec.Header().Get("X-Budget-Remaining-Tokens"))
	if err != nil {
		t.Fatalf("remaining %q: %v", rec.Header().Get("X-Budget-Remaining-Tokens"), err)
	}
	return 100000 - left
}

// imageRequest is an OpenAI request with a short text and the content
// part image (a JSON object after a comma, or ""), max_tokens 64.
func imageRequest(image string) string {
	return `{"model":"sluice-sim","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"}` +
		image + `]}]}`
}

// Many high-resolution image requests at once, each answered by a model
// that counts the image as OpenAI's tile-counting models do: the door
// reserves each by its tiles, so however many start together, the month
// they settle into stays within its budget.
func TestConcurrentImageRequestsStayWithinTheBudget(t *testing.T) {
	const limit, output = 10000, 64
	// What the model reports: the text as the door counts it, the image
	// by its tiles, every output token. (Measured first: each test server
	// starts from a clean Redis.)
	text := int64(chargedFor(t, "") - output)
	image := int64(tokens.ImageSized(3000, 1100, "high"))
	srv, tc, counter := budgetServerWith(t, limit, 0, func(c *config.Config) { c.API.MaxBodyBytes = 64 << 10 })
	body := imageRequest(`,{"type":"image_url","image_url":{"url":"` + testenv.PNGDataURL(t, 3000, 1100) + `"}}`)
	// Every start is held until all have been let in or refused: the
	// admitted ones hold their reservations at once.
	const requests = 20
	tc.hold, tc.holding = make(chan struct{}), make(chan struct{}, requests)
	refused := make(chan struct{}, requests)
	var wg sync.WaitGroup
	for range requests {
		wg.Go(func() {
			if rec := as(srv, keyAlice, "POST", "/v1/chat/completions", body); rec.Code == http.StatusTooManyRequests {
				refused <- struct{}{}
			}
		})
	}
	for held, out := 0, 0; held+out < requests; {
		select {
		case <-tc.holding:
			held++
		case <-refused:
			out++
		case <-time.After(10 * time.Second):
			t.Fatalf("%d requests held, %d refused, of %d", held, out, requests)
		}
	}
	tc.mu.Lock()
	inputs := slices.Clone(tc.inputs)
	tc.mu.Unlock()
	var settles sync.WaitGroup
	for _, in := range inputs {
		settles.Go(func() {
			if _, err := counter.Settle(context.Background(), in.BudgetReservation,
				budget.Use{PromptTokens: text + image, CompletionTokens: output, Pool: in.Pool}); err != nil {
				t.Error(err)
			}
		})
	}
	settles.Wait()
	close(tc.hold)
	wg.Wait()
	if len(inputs) < 2 {
		t.Fatalf("%d requests started, want several at once", len(inputs))
	}
	s, err := counter.Status(context.Background(), "acme", budget.Limit{Tokens: limit})
	if err != nil {
		t.Fatal(err)
	}
	if s.Used.Tokens > limit || s.Used.Tokens < int64(len(inputs))*(text+image+output) {
		t.Fatalf("%d image requests of %d tokens each started and settled %d tokens into a month of %d",
			len(inputs), text+image+output, s.Used.Tokens, limit)
	}
}
