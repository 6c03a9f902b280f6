package proxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/tests/chatclient"
)

// The crowd: one heavy tenant with as many clients as ten light ones
// together, every client on an address of its own.
const (
	heavyClients  = 1000
	lightTenants  = 10
	lightClients  = 100 // each
	crowdClients  = heavyClients + lightTenants*lightClients
	crowdDeadline = 5 * time.Minute
)

// 2,000 SSE clients at once through the proxy, each from its own address
// and under a per-address rate limit that a single address could not
// meet: had Sluice counted them by the proxy's address (the connection's),
// the per-address connection cap would close most of them and the rate
// limit refuse the rest. Every client gets an answer or a documented
// refusal with Retry-After, none a transport error; nobody is banned;
// and the heavy tenant, half the crowd, gets no more than its fair share
// while every tenant waits.
func TestCrowdThroughTheProxy(t *testing.T) {
	slow(t)
	keyOf := func(i int) (tenant, key string) {
		if i < heavyClients {
			return "heavy", "k-heavy"
		}
		tenant = fmt.Sprintf("light-%d", (i-heavyClients)%lightTenants)
		return tenant, "k-" + tenant
	}
	s := startStack(t, func(cfg *config.Config) {
		// The door's Redis calls queue behind the whole crowd's on two
		// cores shared with the dev server, HAProxy and the clients; the
		// default 1 s would turn that wait into 503 unavailable.
		cfg.Redis.RequestTimeout = 5 * time.Second
		cfg.Limits.Tiers["crowd"] = policy.Tier{Weight: 3, MaxWait: 4 * time.Minute,
			IP: policy.Rate{RequestsPerMinute: 60}}
		cfg.Auth.APIKeys = []config.APIKey{{Key: "k-heavy", Tenant: "heavy", Tier: "crowd"}, {Key: "k-ready", Tenant: "ready", Tier: "crowd"}}
		for i := range lightTenants {
			tenant := fmt.Sprintf("light-%d", i)
			cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, config.APIKey{Key: "k-" + tenant, Tenant: tenant, Tier: "crowd"})
		}
	})
	s.waitReady(readyAddr, "k-ready")

	results := make([]*chatclient.Result, crowdClients)
	var wg sync.WaitGroup
	start := time.Now()
	// In a mixed order, as a crowd arrives: first come, first served
	// would then give the heavy tenant half of every stretch of answers.
	for _, i := range rand.New(rand.NewPCG(1, 2)).Perm(crowdClients) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, key := keyOf(i)
			hc := clientFrom(clientAddr(i), "")
			defer hc.CloseIdleConnections()
			results[i] = chatclient.Send(context.Background(), hc, s.proxyURL, chatclient.Request{Key: key, MaxTokens: 8, Bound: crowdDeadline})
		}()
	}
	wg.Wait()
	t.Logf("%d clients through HAProxy finished after %.1f s", crowdClients, time.Since(start).Seconds())

	t.Logf("outcomes: %s", chatclient.Tally(results))
	var answered []answer
	for i, r := range results {
		tenant, _ := keyOf(i)
		if r.Terminal == events.TypeDone {
			answered = append(answered, answer{tenant: tenant, at: r.End()})
		}
		if !documented(r) {
			t.Errorf("client %d (%s, %s): %s: neither an answer nor a documented refusal", i, clientAddr(i), tenant, r.Summary())
		}
	}
	page := s.metrics()
	for _, name := range []string{"sluice_bans_total", "sluice_banned_requests_total", "sluice_api_connections_refused_total"} {
		if l := metricLines(page, name); len(l) > 0 {
			t.Errorf("%s: %v, want none: a crowd of distinct clients was taken for one", name, l)
		}
	}
	if l := metricLines(page, `sluice_ratelimit_decisions_total{decision="deny",dimension="ip"}`); len(l) > 0 {
		t.Errorf("per-address rate limit refused %v: clients were counted by the proxy's address", l)
	}
	checkFairShares(t, answered)
}

// answer is one client's answer: its tenant and when it ended.
type answer struct {
	tenant string
	at     time.Time
}

// checkFairShares looks at the first answers, while every tenant still
// has clients waiting: equal weights share the permits equally, so the
// heavy tenant, half of the crowd, gets about one answer in 11 (first
// come, first served would give it one in two) and no light tenant gets
// less than half of a share.
func checkFairShares(t *testing.T, answered []answer) {
	t.Helper()
	// Every light tenant still waits until about (lightTenants+1) times
	// its clients have been answered; half of that is well inside.
	n := min(len(answered)/2, (lightTenants+1)*lightClients/2)
	if n < 10*(lightTenants+1) {
		t.Errorf("only %d answers of %d clients: too few to judge the shares", len(answered), crowdClients)
		return
	}
	sort.Slice(answered, func(i, j int) bool { return answered[i].at.Before(answered[j].at) })
	count := map[string]int{}
	for _, a := range answered[:n] {
		count[a.tenant]++
	}
	fair := float64(n) / float64(lightTenants+1)
	var shares []string
	for tenant, c := range count {
		shares = append(shares, fmt.Sprintf("%s %d", tenant, c))
	}
	sort.Strings(shares)
	t.Logf("first %d answers by tenant (a fair share is %.0f): %s", n, fair, strings.Join(shares, ", "))
	if count["heavy"] > n/4 {
		t.Errorf("the heavy tenant got %d of the first %d answers, more than a quarter (a fair share is %.0f)", count["heavy"], n, fair)
	}
	for i := range lightTenants {
		tenant := fmt.Sprintf("light-%d", i)
		if float64(count[tenant]) < fair/2 {
			t.Errorf("%s got %d of the first %d answers, less than half its fair share (%.0f)", tenant, count[tenant], n, fair)
		}
	}
}

// documented says whether a client got what Sluice promises under load
// (chatclient's OK: no transport error, hang or broken stream) and that
// it was an answer, a terminal event, or a 429 or 503 with Retry-After.
func documented(r *chatclient.Result) bool {
	switch {
	case !r.OK():
		return false
	case r.Status == http.StatusTooManyRequests, r.Status == http.StatusServiceUnavailable:
		return r.RetryAfter != ""
	}
	return r.Status == http.StatusOK
}
