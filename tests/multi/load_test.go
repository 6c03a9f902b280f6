package multi

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/chatclient"
)

// TestFairSharesAcrossInstances keeps three tenants on tiers weighted
// 5:3:2 backlogged on the short pool (three permits) through both APIs,
// each request admitted by whichever worker runs it, and counts the
// answers each tenant gets while all three wait: about 50/30/20, as one
// process gives (pkg/admission TestFairSharesFollowWeights). The queue is
// one per pool in Redis, so the number of processes must not matter.
func TestFairSharesAcrossInstances(t *testing.T) {
	s := stackFor(t)
	const (
		perTenant = 6
		warmUp    = 5 * time.Second
		run       = 35 * time.Second
	)
	// Client c is the tenant c%3's, through the APIs in turn.
	start := time.Now()
	load := chatclient.StartLoad(s.http, perTenant*len(fairTenants), func(c, n int) (string, string) {
		f, i := fairTenants[c%len(fairTenants)], c/len(fairTenants)
		return s.apis[(i+n)%len(s.apis)].url, f.key(i*1000 + n)
	}, chatclient.Request{MaxTokens: 20, Bound: 90 * time.Second})
	until := start.Add(run)
	time.Sleep(time.Until(until))
	all := load.Stop()
	answered := map[string]int{}
	for _, r := range all {
		// Counted while every tenant was still sending.
		if r.Terminal == "done" && r.End().After(start.Add(warmUp)) && r.End().Before(until) {
			answered[tenantOfKey(r.Key)]++
		}
	}
	total := 0
	for _, n := range answered {
		total += n
	}
	t.Logf("%d requests over 2 APIs and 2 workers in %s: %s; answered between %s and %s: %v",
		len(all), time.Since(start).Round(time.Millisecond), chatclient.Tally(all), warmUp, run, answered)
	if total < 40 {
		t.Fatalf("only %d answers counted: too few to judge shares", total)
	}
	weights := 0
	for _, f := range fairTenants {
		weights += f.weight
	}
	for _, f := range fairTenants {
		share, want := float64(answered[f.name])/float64(total), float64(f.weight)/float64(weights)
		t.Logf("%s (weight %d): %.1f%% of %d answers, want %.0f%%", f.name, f.weight, 100*share, total, 100*want)
		if math.Abs(share-want) > 0.08 {
			t.Errorf("%s got %.1f%% of the answers, want %.0f%% ± 8", f.name, 100*share, 100*want)
		}
	}
	for _, r := range all {
		if !r.OK() {
			t.Errorf("promise broken: %s", r.Summary())
		}
	}
	checkSettled(t, s, "fair-5", "fair-3", "fair-2")
}

// TestCrowdLeavesNothingAcrossInstances sends 300 clients through both
// APIs, each hanging up at a random moment (before its headers, waiting
// at the door or in the queue, or mid-answer), and then checks that
// nothing they held is left, whichever process held it: no permit, queue
// place or running request, and every token reservation refunded exactly
// once.
func TestCrowdLeavesNothingAcrossInstances(t *testing.T) {
	s := stackFor(t)
	const (
		crowd  = 300
		spread = 6 * time.Second
		leave  = 3 * time.Second
	)
	rs := chatclient.Crowd(crowd, spread, leave, rand.New(rand.NewPCG(3, 4)), func(i int, after time.Duration) *chatclient.Result {
		return s.send(context.Background(), s.apis[i%2], chatclient.Request{MaxTokens: 40, Bound: time.Minute, LeaveAfter: after})
	})
	t.Logf("%d clients over %s, each hanging up 1ms–%s after sending: %s", crowd, spread, leave, chatclient.Tally(rs))
	for _, r := range rs {
		if !r.OK() {
			t.Errorf("promise broken: %s", r.Summary())
		}
	}
	checkSettled(t, s, tenant)
	// And the stack still answers.
	for i := range 2 {
		if r := s.send(context.Background(), s.apis[i], chatclient.Request{MaxTokens: 10}); r.Terminal != "done" {
			t.Errorf("after the crowd, through %s: %s", s.apis[i].Name, r.Summary())
		}
	}
}
