package integration

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
)

const (
	keyMetered = "k-it-metered"
	keyBroke   = "k-it-broke"
)

// itPrice is every pool's model's price in the stack's prices.
var itPrice = config.Price{InputPerMillionUSD: 0.5, OutputPerMillionUSD: 1.5}

// An answered request's budget charge (its bound, at the door) is settled
// by its workflow's Finalize with the tokens its done event billed, in
// tokens and spend; a tenant whose month cannot hold a request is refused
// at the door with 429 budget_exceeded and Retry-After.
func TestBudgetSettlesWithWhatTheAnswerUsed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := open(t, ctx, http.MethodPost, "/v1/chat", `{"query":"How does a token bucket refill?","max_tokens":24}`,
		map[string]string{"Authorization": "Bearer " + keyMetered})
	defer s.close()
	if left, _ := strconv.Atoi(s.resp.Header.Get("X-Budget-Remaining-Tokens")); left <= 0 || left > 1_000_000-24 {
		t.Fatalf("X-Budget-Remaining-Tokens %q: want the bound charged", s.resp.Header.Get("X-Budget-Remaining-Tokens"))
	}
	evs := s.until(t, terminal)
	var done events.Done
	if last := evs[len(evs)-1]; last.Event != events.TypeDone || last.Decode(&done) != nil {
		t.Fatalf("last event %+v, want done", last)
	}
	result(t, s.id) // the workflow closed: Finalize settled

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, stack.baseURL+"/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+keyMetered)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var u struct {
		Budget struct {
			TokensUsed   int64   `json:"tokens_used"`
			SpendUsedUSD float64 `json:"spend_used_usd"`
		} `json:"budget"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&u) != nil {
		t.Fatalf("GET /v1/usage: %d", resp.StatusCode)
	}
	p, c := done.Usage.PromptTokens, done.Usage.CompletionTokens
	wantMicros := math.Round(float64(p)*itPrice.InputPerMillionUSD + float64(c)*itPrice.OutputPerMillionUSD)
	if u.Budget.TokensUsed != int64(p+c) || math.Abs(u.Budget.SpendUsedUSD*1e6-wantMicros) > 0.5 {
		t.Fatalf("budget used %+v, want %d tokens and %.0f micro-dollars (%d prompt + %d completion)", u.Budget, p+c, wantMicros, p, c)
	}

	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, stack.baseURL+"/v1/chat", strings.NewReader(`{"query":"hello","max_tokens":24}`))
	req.Header.Set("Authorization", "Bearer "+keyBroke)
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), `"budget_exceeded"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a tenant over its budget: %d %s (Retry-After %q)", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
}
