package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	sreq "github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/chatclient"
)

// backendFault is one way the second of the pool's two endpoints breaks.
type backendFault struct {
	name  string
	fault llmsim.Fault
	// fast: in the subset `go test` runs.
	fast bool
}

var backendFaults = []backendFault{
	{name: "stall before the first token", fault: llmsim.Fault{StallFirstToken: true}, fast: true},
	{name: "stall mid-stream (after 5 tokens)", fault: llmsim.Fault{StallAfterTokens: 5}},
	{name: "HTTP 503 on every request", fault: llmsim.Fault{ErrorStatus: http.StatusServiceUnavailable}},
	// Slower than breaker.slow_first_token (1 s) but within the
	// first-token and idle deadlines: an outlier to eject, not a failure.
	{name: "slow (+1.2 s a token)", fault: llmsim.Fault{TokenDelay: 1200 * time.Millisecond}},
}

// testBackendFaults breaks one of the pool's two endpoints in each way in
// turn while a closed loop runs, then the whole pool.
func testBackendFaults(t *testing.T) {
	s := startStack(t, stackOptions{})
	for _, f := range backendFaults {
		t.Run(strings.ReplaceAll(f.name, " ", "-"), func(t *testing.T) {
			if !f.fast {
				slow(t)
			}
			s.oneBackendDown(t, f)
		})
	}
	t.Run("whole-pool-down", func(t *testing.T) {
		slow(t)
		s.poolDown(t)
	})
}

// backendRequest is the backend scenarios' request: short answers, so
// that a slow endpoint's stay within the bound.
var backendRequest = chatclient.Request{MaxTokens: 20, Bound: time.Minute}

// oneBackendDown breaks the second endpoint under a closed loop, waits
// for its circuit to open, lets the loop run on the first endpoint alone,
// then heals it and waits for its circuit to close.
func (s *stack) oneBackendDown(t *testing.T, f backendFault) {
	l := s.startLoad(8, constTenant(tenantLoad), backendRequest)
	time.Sleep(time.Second)
	s.setFault(t, 1, f.fault)
	opened := s.waitCircuit(1, 2, 20*time.Second)
	routedAt := time.Now()
	time.Sleep(3 * time.Second)
	s.setFault(t, 1, llmsim.Fault{})
	closed := s.waitCircuit(1, 0, 20*time.Second)
	rs := l.Stop()
	var extra []string
	if opened < 0 {
		extra = append(extra, "the faulty endpoint's circuit never opened")
	}
	if closed < 0 {
		extra = append(extra, "the healed endpoint's circuit never closed")
	}
	notes := fmt.Sprintf("8 clients in a closed loop, %d-token answers, 6 permits, endpoints A and B, B broken; B's circuit opened %s after the fault, closed again %s after B was healed; %d requests answered after B's circuit opened",
		backendRequest.MaxTokens, secs(opened), secs(closed), answeredAfter(rs, routedAt))
	s.finishScenario(t, row{fault: "one of two backends: " + f.name, recover: opened,
		recoverTo: "fault → its circuit open, every request to the other endpoint", notes: notes}, rs, append(extra, cutAnswers(rs)...), tenantLoad)
}

// poolDownFor is how long both endpoints stall.
const poolDownFor = 20 * time.Second

// poolDown stalls both endpoints: once their circuits are open, requests
// must fail at once with backend_unavailable and a retry-after; after
// both heal, the pool answers again.
func (s *stack) poolDown(t *testing.T) {
	stall := llmsim.Fault{StallFirstToken: true}
	s.setFault(t, 0, stall)
	s.setFault(t, 1, stall)
	down := time.Now()
	var rs []*chatclient.Result
	var fastFails int
	for time.Since(down) < poolDownFor {
		r := s.send(context.Background(), tenantLoad, chatclient.Request{MaxTokens: 8, Bound: 30 * time.Second})
		rs = append(rs, r)
		if r.Terminal == events.TypeError && r.Reason == sreq.ReasonBackendUnavailable && r.RetryAfterS > 0 && r.Took < time.Second {
			fastFails++
		}
	}
	s.setFault(t, 0, llmsim.Fault{})
	s.setFault(t, 1, llmsim.Fault{})
	healed := time.Now()
	recovered := s.timeToRecover(healed, tenantAfter, time.Minute)
	var extra []string
	if fastFails == 0 {
		extra = append(extra, "no request failed fast with backend_unavailable and a retry-after while every circuit was open")
	}
	for _, r := range rs {
		if r.Terminal == events.TypeDone || r.Terminal == events.TypeError && r.RetryAfterS == 0 && r.Reason == sreq.ReasonBackendUnavailable {
			extra = append(extra, "with the whole pool down: "+r.Summary())
		}
	}
	notes := fmt.Sprintf("both endpoints stalled for %s, one client sending one request after another: %d failed in under 1 s with backend_unavailable and a retry-after once both circuits were open", poolDownFor, fastFails)
	s.finishScenario(t, row{fault: "whole pool down (both endpoints stall)", recover: recovered,
		recoverTo: "both healed → first new request answered", notes: notes}, rs, extra, tenantLoad, tenantAfter)
}

// setFault sets one simulator endpoint's fault ({} heals it).
func (s *stack) setFault(t *testing.T, endpoint int, f llmsim.Fault) {
	t.Helper()
	if _, err := s.sims[endpoint].Reconfigure(llmsim.ConfigUpdate{Fault: &f}); err != nil {
		t.Fatal(err)
	}
}

// waitCircuit waits until the short pool's circuit of an endpoint is in
// state (0 closed, 2 open) as the API's /metrics shows it, and returns
// how long that took (-1: not within).
func (s *stack) waitCircuit(endpoint, state int, within time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < within {
		if st, ok := s.circuit(llm.EndpointName(sreq.PoolShort, endpoint)); ok && st == state {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1
}

// circuit reads an endpoint's circuit state in the short pool from the
// API's /metrics.
func (s *stack) circuit(name string) (int, bool) {
	resp, err := s.http.Get(s.baseURL + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "sluice_backend_circuit_state{") || !strings.Contains(line, `endpoint="`+name+`"`) || !strings.Contains(line, `pool="short"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		return int(v), err == nil
	}
	return 0, false
}

// answeredAfter counts the requests sent after at that were answered.
func answeredAfter(rs []*chatclient.Result, at time.Time) int {
	n := 0
	for _, r := range rs {
		if r.Start.After(at) && r.Terminal == events.TypeDone {
			n++
		}
	}
	return n
}

func secs(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}
