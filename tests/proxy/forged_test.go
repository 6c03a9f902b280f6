package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/tests/chatclient"
)

// Addresses of the forged-header test: the forger, the client whose
// address it claims, and the client that checks the stack is up.
const (
	forgerAddr = "127.1.0.66"
	victimAddr = "127.1.0.77"
	readyAddr  = "127.1.9.9"
)

// A client that writes X-Forwarded-For itself, through a trusted proxy,
// gains nothing: whatever it claims (another client's address, the
// proxy's, a chain of them), it is counted by its own address. It cannot
// spend another client's per-address limit or escape its own, and when
// it ignores its 429s the ban falls on its own address, never on the one
// it claimed.
func TestForgedForwardedForGainsNothing(t *testing.T) {
	s := startStack(t, func(cfg *config.Config) {
		cfg.Limits.Tiers["strict"] = policy.Tier{Weight: 3,
			// Three requests per address, and no refill within the test.
			IP: policy.Rate{RequestsPerMinute: 0.001, RequestBurst: 3}}
		cfg.Limits.Tiers["open"] = policy.Tier{Weight: 3}
		cfg.Limits.Ban = config.Ban{Enabled: true, Threshold: 5, Window: 10 * time.Second, Duration: time.Minute,
			Exempt: config.Default().Limits.Ban.Exempt}
		cfg.Auth.APIKeys = []config.APIKey{
			{Key: "k-victim", Tenant: "victim", Tier: "strict"},
			{Key: "k-forger", Tenant: "forger", Tier: "strict"},
			{Key: "k-forger-2", Tenant: "forger", User: "second", Tier: "strict"},
			{Key: "k-ready", Tenant: "ready", Tier: "open"},
		}
	})
	s.waitReady(readyAddr, "k-ready")
	ctx := context.Background()
	send := func(hc *http.Client, key string) *chatclient.Result {
		return chatclient.Send(ctx, hc, s.proxyURL, chatclient.Request{Key: key, MaxTokens: 4, Bound: 30 * time.Second})
	}

	// Three requests are the forger's own, whatever it claims; the
	// fourth finds its own bucket empty.
	for i, claim := range []string{victimAddr, "127.0.0.1", "10.9.8.7, " + victimAddr, readyAddr} {
		r := send(clientFrom(forgerAddr, claim), "k-forger")
		switch {
		case i < 3 && r.Terminal != "done":
			t.Fatalf("forger's request %d (X-Forwarded-For: %s): %s, want an answer", i+1, claim, r.Summary())
		case i == 3 && (r.Status != http.StatusTooManyRequests || r.Code != "rate_limited" || r.RetryAfter == ""):
			t.Fatalf("forger's request %d (X-Forwarded-For: %s): %s, want 429 rate_limited: forging escaped its own limit", i+1, claim, r.Summary())
		}
	}
	// Ignoring its 429s earns the forger a ban, on its own address.
	banned := false
	for end := time.Now().Add(20 * time.Second); !banned && time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		r := send(clientFrom(forgerAddr, victimAddr), "k-forger")
		if r.Err != nil || r.Status != http.StatusTooManyRequests {
			t.Fatalf("forger over its limit: %s, want 429", r.Summary())
		}
		banned = r.Code == "banned"
	}
	if !banned {
		t.Fatal("the forger was never banned for ignoring its 429s")
	}
	// The client whose address was claimed still has all of its own
	// limit, and no ban.
	for i := range 3 {
		if r := send(clientFrom(victimAddr, ""), "k-victim"); r.Terminal != "done" {
			t.Fatalf("victim's request %d: %s, want an answer: the forger spent or banned the victim's address", i+1, r.Summary())
		}
	}
	// The ban is the forger's address's, not only its key's: a fresh key
	// from there is refused, whatever address it claims.
	if r := send(clientFrom(forgerAddr, victimAddr), "k-forger-2"); r.Status != http.StatusTooManyRequests || r.Code != "banned" {
		t.Fatalf("a fresh key from the forger's address: %s, want 429 banned", r.Summary())
	}
}
