package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/policy"
	sreq "github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// testWorkerKilledWhilePaused kills the worker while flex streams are
// paused for priority requests (preemption by continuation): a paused
// stream waits for its permit inside its LLM activity, so the kill takes
// the activity, the stream's place in the queue and the streams it was
// paused for at once. Every client must still get its answer or an end
// that says why, with no token repeated, and nothing may be left held or
// queued.
func testWorkerKilledWhilePaused(t *testing.T) {
	slow(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	workerMetrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	s := startStack(t, stackOptions{
		externalWorker: true,
		// Answers of several seconds, so that a paused one is still
		// waiting when the worker dies.
		simulator: func(c *llmsim.Config) { c.AnswerMinTokens, c.AnswerMaxTokens = 200, 300 },
		configure: func(cfg *config.Config) {
			for _, p := range []*config.Pool{&cfg.Pools.Short, &cfg.Pools.Long} {
				p.Continuation = config.ContinuationVLLM
			}
			cfg.Admission.Preemption = config.Preemption{Enabled: true, MinTokens: 5, MaxPauses: 2}
			tier := cfg.Limits.Tiers[tierName]
			tier.DefaultClass = sreq.ClassDefault
			tier.Classes = map[string]policy.ClassLimits{
				sreq.ClassPriority: {Weight: 3}, sreq.ClassDefault: {Weight: 3}, sreq.ClassFlex: {Weight: 1},
			}
			cfg.Limits.Tiers[tierName] = tier
			cfg.Metrics.WorkerAddr = fmt.Sprintf("127.0.0.1:%d", port)
		},
	})
	flex := chatclient.Request{MaxTokens: 400, Bound: 2 * time.Minute, ServiceTier: sreq.ClassFlex}
	l := s.startLoad(s.cfg.Pools.Short.MaxConcurrency, constTenant(tenantLoad), flex)
	s.waitStreaming(t, 10*time.Second)
	// Past the streams' first tokens and a keep-alive round, at which
	// they offer themselves for a pause.
	time.Sleep(1500 * time.Millisecond)

	urgent := chatclient.Request{MaxTokens: 100, Bound: 2 * time.Minute, ServiceTier: sreq.ClassPriority}
	var mu sync.Mutex
	var urgentRs []*chatclient.Result
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			r := s.send(context.Background(), tenantAfter, urgent)
			mu.Lock()
			urgentRs = append(urgentRs, r)
			mu.Unlock()
		})
	}
	paused := waitPaused(t, workerMetrics, 20*time.Second)
	killed, restarted := s.killWorkerFor(t, 2*time.Second)
	recovered := s.timeToRecover(restarted, tenantAfter, time.Minute)
	wg.Wait()
	time.Sleep(3 * time.Second)
	rs := append(l.Stop(), urgentRs...)
	continued := 0
	for _, r := range rs {
		if r.Pauses > 0 && r.Terminal == "done" {
			continued++
		}
	}
	notes := fmt.Sprintf("%d flex clients in a closed loop on %d permits, 3 priority requests pausing their streams; the worker was killed once %.0f pauses were counted and was down 2 s; "+
		"%d requests sent before the kill were answered after the restart, %d answers paused and continued to done",
		s.cfg.Pools.Short.MaxConcurrency, s.cfg.Pools.Short.MaxConcurrency, paused, servedAcross(rs, killed, restarted), continued)
	s.finishScenario(t, row{fault: "worker killed (kill -9) while flex streams were paused for priority requests, restarted 2 s later", recover: recovered,
		recoverTo: "worker started again → first new request answered", notes: notes}, rs, cutAnswers(rs), tenantLoad, tenantAfter)
}

// waitPaused waits until the worker's /metrics counts a paused stream,
// and returns the count.
func waitPaused(t *testing.T, url string, within time.Duration) float64 {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if n := pausesCounted(url); n > 0 {
			return n
		}
	}
	t.Fatalf("no stream was paused within %s (%s)", within, url)
	return 0
}

// pausesCounted sums sluice_admission_pauses_total over its pools on a
// /metrics page (0 when it cannot be read).
func pausesCounted(url string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	total := 0.0
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "sluice_admission_pauses_total") {
			continue
		}
		if n, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			total += n
		}
	}
	return total
}
