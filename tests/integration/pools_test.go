package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// Two tenants of equal weight, both backlogged on pools that share their
// servers: one asks long questions (routed to the long pool), the other
// short ones. Each gets half the tokens served (± 5 points), although a
// long answer is twice a short one in tokens and the long pool may hold
// only 3 of the 4 permits: one fair queue across the pools, charged the
// requests' bounds and settled with the tokens they used. With the pools
// apart the split of the permits, not the tenants' weights, decided the
// shares (pkg/admission's TestGroupSharesTokensAcrossPools shows both).
func TestEqualTenantsShareTokensAcrossPools(t *testing.T) {
	setPoolLimits(t, 4, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type served struct {
		tenant string
		end    time.Time
		tokens int
		ttft   time.Duration
	}
	var mu sync.Mutex
	var done []served
	var wg sync.WaitGroup
	stop := time.Now().Add(20 * time.Second)
	loop := func(tenant, key, query string) {
		defer wg.Done()
		body, _ := json.Marshal(map[string]any{"query": query, "max_tokens": 48})
		for time.Now().Before(stop) && ctx.Err() == nil {
			start := time.Now()
			s := open(t, ctx, http.MethodPost, "/v1/chat", string(body), map[string]string{"Authorization": "Bearer " + key})
			var first time.Duration
			evs := s.until(t, func(ev testenv.SSEEvent) bool {
				if ev.Event == events.TypeToken && first == 0 {
					first = time.Since(start)
				}
				return terminal(ev)
			})
			s.close()
			last := evs[len(evs)-1]
			if last.Event != events.TypeDone {
				t.Errorf("%s: request ended %s %s", tenant, last.Event, last.Data)
				return
			}
			var d events.Done
			if err := last.Decode(&d); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			done = append(done, served{tenant: tenant, end: time.Now(), tokens: d.Usage.PromptTokens + d.Usage.CompletionTokens, ttft: first})
			mu.Unlock()
		}
	}
	for i := range 4 {
		wg.Add(1)
		go loop("long", "k-pool-long", fmt.Sprintf("%d. %s", i, longQuery))
	}
	for i := range 12 {
		wg.Add(1)
		go loop("short", "k-pool-short", fmt.Sprintf("%d. What does a leased permit protect?", i))
	}
	wg.Wait()
	// Count what was served while both were backlogged: after a warm-up,
	// before the loops began to stop.
	from, to := stop.Add(-15*time.Second), stop.Add(-time.Second)
	tokens := map[string]int{}
	answers := map[string]int{}
	for _, s := range done {
		if s.end.After(from) && s.end.Before(to) {
			tokens[s.tenant] += s.tokens
			answers[s.tenant]++
		}
	}
	total := tokens["long"] + tokens["short"]
	if total == 0 || answers["long"] < 5 || answers["short"] < 5 {
		t.Fatalf("too little served to judge: %v tokens, %v answers", tokens, answers)
	}
	share := float64(tokens["long"]) / float64(total)
	t.Logf("served in the window: long %d tokens (%d answers), short %d tokens (%d answers): long share %.1f%%",
		tokens["long"], answers["long"], tokens["short"], answers["short"], 100*share)
	if math.Abs(2*share-1) > 0.10 {
		t.Errorf("equal-weight tenants got %.1f%% and %.1f%% of the tokens: more than 10 points apart", 100*share, 100*(1-share))
	}
}
