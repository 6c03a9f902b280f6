package multi

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
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
	start := time.Now()
	until := start.Add(run)
	var mu sync.Mutex
	answered := map[string]int{}
	var all []*result
	var wg sync.WaitGroup
	for _, f := range fairTenants {
		for c := range perTenant {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; time.Now().Before(until); n++ {
					r := s.send(context.Background(), s.apis[(c+n)%2], request{key: f.key(c*1000 + n), maxTokens: 20, bound: 90 * time.Second})
					end := time.Now()
					mu.Lock()
					all = append(all, r)
					// Counted while every tenant was still sending.
					if r.terminal == "done" && end.After(start.Add(warmUp)) && end.Before(until) {
						answered[f.name]++
					}
					mu.Unlock()
					if r.status != 200 {
						time.Sleep(200 * time.Millisecond)
					}
				}
			}()
		}
	}
	wg.Wait()
	total := 0
	for _, n := range answered {
		total += n
	}
	t.Logf("%d requests over 2 APIs and 2 workers in %s: %s; answered between %s and %s: %v",
		len(all), time.Since(start).Round(time.Millisecond), tally(all), warmUp, run, answered)
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
		if !r.ended() {
			t.Errorf("no terminal event: %s", r.summary())
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
	rng := rand.New(rand.NewPCG(3, 4))
	rs := make([]*result, crowd)
	var wg sync.WaitGroup
	for i := range crowd {
		after := time.Duration(rng.Int64N(int64(leave))) + time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i] = s.send(context.Background(), s.apis[i%2], request{maxTokens: 40, bound: time.Minute, leaveAfter: after})
		}()
		time.Sleep(spread / crowd)
	}
	wg.Wait()
	t.Logf("%d clients over %s, each hanging up 1ms–%s after sending: %s", crowd, spread, leave, tally(rs))
	for _, r := range rs {
		if !r.ended() {
			t.Errorf("no terminal event: %s", r.summary())
		}
	}
	checkSettled(t, s, tenant)
	// And the stack still answers.
	for i := range 2 {
		if r := s.send(context.Background(), s.apis[i], request{maxTokens: 10}); r.terminal != "done" {
			t.Errorf("after the crowd, through %s: %s", s.apis[i].name, r.summary())
		}
	}
}
