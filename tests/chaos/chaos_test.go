package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	sreq "github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/settle"
)

// TestChaos runs each fault against a stack of its own. The fast subset
// (what `go test ./...` runs) is a backend that hangs before its first
// token: the cheapest row, it covers the LLM path's deadlines, retry and
// breaker, and it is not timed to the second; SLUICE_CHAOS=all runs the rest (api's
// TestSlowSSEReaderIsDroppedAndDetached covers the SSE writer's deadline
// in make test).
func TestChaos(t *testing.T) {
	t.Run("worker-kill-9", testWorkerKilled)
	t.Run("worker-kill-before-usage-record", testUsageAcrossWorkerKill)
	t.Run("worker-kill-while-paused", testWorkerKilledWhilePaused)
	t.Run("redis-restart-empty", testRedisRestart)
	t.Run("redis-stall", testRedisStall)
	t.Run("redis-down", testRedisDown)
	t.Run("temporal-restart", testTemporalRestart)
	t.Run("backend-hang", testBackendFaults)
	t.Run("mid-stream-failover", testMidStreamFailover)
	t.Run("clients-disconnect", testClientsDisconnect)
	t.Run("client-stops-reading", testSlowReader)
	t.Run("healing-off-after-restart", testHealingOffAcrossRestart)
}

// constTenant is a load whose every request is one tenant's.
func constTenant(tenant string) func() string { return func() string { return tenant } }

// loadRequest is the closed loops' request: an answer of about two
// seconds, long enough for a fault to land mid-stream.
var loadRequest = chatclient.Request{MaxTokens: 100, Bound: time.Minute}

// cutAnswers lists answers that were cut with anything but the promised
// end: a client that had tokens gets the rest of its answer, or
// stream_interrupted (a model cannot resume mid-answer).
func cutAnswers(rs []*chatclient.Result, allowed ...string) []string {
	var out []string
	for _, r := range rs {
		if r.Tokens == 0 || r.Terminal != events.TypeError {
			continue
		}
		ok := r.Reason == sreq.ReasonStreamInterrupted
		for _, a := range allowed {
			ok = ok || r.Reason == a
		}
		if !ok {
			out = append(out, fmt.Sprintf("an answer cut after %d tokens ended with %s, not stream_interrupted: %s", r.Tokens, r.Reason, r.Summary()))
		}
	}
	return out
}

// servedAcross counts the requests sent before at that were answered
// after until: they waited through the fault.
func servedAcross(rs []*chatclient.Result, at, until time.Time) int {
	n := 0
	for _, r := range rs {
		if r.Start.Before(at) && r.End().After(until) && r.Terminal == events.TypeDone {
			n++
		}
	}
	return n
}

// finishScenario fills in the scenario's row — what its clients saw and
// everything lost: broken promises on the streams, extra findings of the
// scenario, and what the stack left behind — and records it.
func (s *stack) finishScenario(t *testing.T, r row, rs []*chatclient.Result, extra []string, tenants ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r.saw = chatclient.Tally(rs)
	r.lost = append(settle.First(chatclient.Broken(rs), 10), extra...)
	r.lost = append(r.lost, s.leftovers(ctx, tenants...)...)
	if r.recover < 0 {
		r.lost = append(r.lost, "not recovered within the bound ("+r.recoverTo+")")
	}
	record(t, r)
}

// testWorkerKilled kills -9 the only worker while streams run and
// requests wait, and starts it again two seconds later.
func testWorkerKilled(t *testing.T) {
	slow(t)
	s := startStack(t, stackOptions{externalWorker: true})
	l := s.startLoad(12, constTenant(tenantLoad), loadRequest)
	s.waitStreaming(t, 10*time.Second)
	killed, restarted := s.killWorkerFor(t, 2*time.Second)
	recovered := s.timeToRecover(restarted, tenantAfter, time.Minute)
	time.Sleep(3 * time.Second)
	rs := l.Stop()
	notes := fmt.Sprintf("12 clients in a closed loop, 6 permits; the worker was down 2 s; %d requests sent before the kill were answered after the restart",
		servedAcross(rs, killed, restarted))
	s.finishScenario(t, row{fault: "worker killed (kill -9) mid-stream, restarted 2 s later", recover: recovered,
		recoverTo: "worker started again → first new request answered", notes: notes}, rs, cutAnswers(rs), tenantLoad, tenantAfter)
}

// killWorkerFor kills -9 the worker, starts it again down later, and
// returns when it was killed and when it was started again.
func (s *stack) killWorkerFor(t *testing.T, down time.Duration) (killed, restarted time.Time) {
	t.Helper()
	killed = time.Now()
	if err := s.worker.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(down)
	if err := s.worker.Start(); err != nil {
		t.Fatal(err)
	}
	return killed, time.Now()
}

// waitStreaming waits until both simulators together run at least one
// sequence: a fault injected now lands mid-stream.
func (s *stack) waitStreaming(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if s.sims[0].Stats().Running+s.sims[1].Stats().Running >= 3 {
			// A little further into the streams.
			time.Sleep(300 * time.Millisecond)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no streams running after %s", within)
}
