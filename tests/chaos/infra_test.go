package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	sreq "github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// testRedisRestart kills Redis mid-load and starts an empty one on the
// same port: permits, queue, buckets, reservations, event streams and the
// knowledge base are all gone at once.
func testRedisRestart(t *testing.T) {
	s, l, afterLoss := loadAcrossRedisLoss(t)
	if err := s.redis.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	afterLoss()
	recovered := s.timeToRecover(restarted, tenantAfter, time.Minute)
	time.Sleep(3 * time.Second)
	rs := l.Stop()
	notes := "12 clients in a closed loop, 6 permits; Redis killed and started empty on the same port (no persistence); " +
		"refunds checked for the requests sent after the restart (the earlier ones' buckets and reservations were lost with Redis)"
	s.finishScenario(t, row{fault: "Redis restarted empty mid-load", recover: recovered,
		recoverTo: "empty Redis up → first new request answered", notes: notes}, rs, cutAnswers(rs), tenantAfter)
}

// loadAcrossRedisLoss starts a stack with 12 clients in a closed loop
// and waits until answers stream. afterLoss, called once the lost Redis
// is back (empty), moves the clients to tenantAfter: requests from then on
// reserve in the new Redis, so their refunds can be checked to the token;
// the earlier ones' buckets went with the old.
func loadAcrossRedisLoss(t *testing.T) (s *stack, l *chatclient.Load, afterLoss func()) {
	slow(t)
	s = startStack(t, stackOptions{})
	var tenant atomic.Value
	tenant.Store(tenantLoad)
	l = s.startLoad(12, func() string { return tenant.Load().(string) }, loadRequest)
	s.waitStreaming(t, 10*time.Second)
	return s, l, func() { tenant.Store(tenantAfter) }
}

// stallFor is how long the Redis stall lasts.
const stallFor = 5 * time.Second

// testRedisStall stalls Redis for 5 s (CLIENT PAUSE … ALL: connections
// are accepted, no command is answered) while streams run, and sends new
// requests to the door during the stall.
func testRedisStall(t *testing.T) {
	slow(t)
	s := startStack(t, stackOptions{})
	l := s.startLoad(8, constTenant(tenantLoad), loadRequest)
	s.waitStreaming(t, 10*time.Second)
	ctx := context.Background()
	if err := s.rdb.Do(ctx, "CLIENT", "PAUSE", strconv.Itoa(int(stallFor.Milliseconds())), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	stalled := time.Now()
	door := s.probeDoor(stalled.Add(stallFor - 500*time.Millisecond))
	time.Sleep(time.Until(stalled.Add(stallFor)))
	recovered := s.timeToRecover(stalled.Add(stallFor), tenantAfter, time.Minute)
	time.Sleep(2 * time.Second)
	rs := l.Stop()
	extra, slowest := doorRefusals(door)
	notes := fmt.Sprintf("8 clients in a closed loop, 6 permits; during the stall %d new requests were sent to the door one after another: %s, the slowest answer in %s",
		len(door), chatclient.Tally(door), slowest.Round(time.Millisecond))
	s.finishScenario(t, row{fault: "Redis stalled 5 s (CLIENT PAUSE ALL)", recover: recovered,
		recoverTo: "stall over → first new request answered", notes: notes}, append(rs, door...), append(extra, cutAnswers(rs)...), tenantLoad, tenantAfter)
}

// downFor is how long Redis stays away in the outage scenario: longer
// than a stage's retries before the model (20 s) and a retried stream's
// wait for its events (20 s), shorter than the door's retries of a
// terminal event (30 s).
const downFor = 25 * time.Second

// testRedisDown kills Redis mid-load and starts it, empty, only 25 s
// later: requests inside the pipeline run out of retries meanwhile. Each
// client gets an answer or a terminal event that says to retry — never
// internal_error — and the door refuses new requests at once.
func testRedisDown(t *testing.T) {
	s, l, afterLoss := loadAcrossRedisLoss(t)
	down := time.Now()
	probed := make(chan []*chatclient.Result)
	go func() { probed <- s.probeDoor(down.Add(downFor - 2*time.Second)) }()
	if err := s.redis.RestartAfter(downFor); err != nil {
		t.Fatal(err)
	}
	door := <-probed
	up := time.Now()
	afterLoss()
	recovered := s.timeToRecover(up, tenantAfter, time.Minute)
	time.Sleep(3 * time.Second)
	rs := l.Stop()
	extra, _ := doorRefusals(door)
	recorded := !testenv.RecordingHistories()
	for _, r := range rs {
		if r.Reason == sreq.ReasonInternal {
			extra = append(extra, "ended as Sluice's fault, not unavailable: "+r.Summary())
		}
		if !recorded && r.Status == http.StatusOK && r.Reason == sreq.ReasonUnavailable {
			// For tests/replay: a request that failed because Redis
			// was away.
			path, n, err := testenv.SaveHistory(context.Background(), s.tc, workflows.ChatWorkflowID(r.ID), "chat_dependency_unavailable")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("recorded %s (%d events)", path, n)
			recorded = true
		}
	}
	notes := fmt.Sprintf("12 clients in a closed loop, 6 permits; Redis killed, down %.1f s, started empty on the same port; during the outage %d new requests were sent to the door one after another: %s",
		up.Sub(down).Seconds(), len(door), chatclient.Tally(door))
	s.finishScenario(t, row{fault: "Redis down 25 s, then started empty", recover: recovered,
		recoverTo: "empty Redis up → first new request answered", notes: notes},
		append(rs, door...), append(extra, cutAnswers(rs, sreq.ReasonUnavailable)...), tenantAfter)
}

// probeDoor sends requests one after another until until, each bounded
// by 10 s.
func (s *stack) probeDoor(until time.Time) []*chatclient.Result {
	var rs []*chatclient.Result
	for time.Now().Before(until) {
		rs = append(rs, s.send(context.Background(), tenantAfter, chatclient.Request{MaxTokens: 4, Bound: 10 * time.Second}))
		time.Sleep(100 * time.Millisecond)
	}
	return rs
}

// doorBound is how fast the door must refuse a request it cannot serve
// for want of Redis: redis.request_timeout (1 s) and some slack.
const doorBound = 1500 * time.Millisecond

// doorRefusals checks that requests sent during a stall were refused at
// once with 503 and Retry-After (or answered, had the stall ended), and
// returns the slowest answer.
func doorRefusals(rs []*chatclient.Result) (lost []string, slowest time.Duration) {
	for _, r := range rs {
		slowest = max(slowest, r.Took)
		switch {
		case r.Status == http.StatusOK && r.Terminal != "":
		case r.Status == http.StatusServiceUnavailable && r.RetryAfter != "" && r.Took <= doorBound:
		default:
			lost = append(lost, fmt.Sprintf("during the stall the door answered %d (Retry-After %q) in %s, not 503 + Retry-After within %s: %s",
				r.Status, r.RetryAfter, r.Took.Round(time.Millisecond), doorBound, r.Summary()))
		}
	}
	return lost, slowest
}

// testTemporalRestart stops the Temporal dev server mid-load and starts
// it again on the same port with its database file.
func testTemporalRestart(t *testing.T) {
	slow(t)
	s := startStack(t, stackOptions{})
	l := s.startLoad(12, constTenant(tenantLoad), loadRequest)
	s.waitStreaming(t, 10*time.Second)
	stopped := time.Now()
	if err := s.temporal.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.temporal.Start(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	recovered := s.timeToRecover(restarted, tenantAfter, 2*time.Minute)
	time.Sleep(3 * time.Second)
	rs := l.Stop()
	notes := fmt.Sprintf("12 clients in a closed loop, 6 permits; the dev server was down %.1f s (SIGINT, then started again on its port and SQLite file); %d requests sent before the stop were answered after the restart",
		restarted.Sub(stopped).Seconds(), servedAcross(rs, stopped, restarted))
	s.finishScenario(t, row{fault: "Temporal dev server restarted mid-load (same database file)", recover: recovered,
		recoverTo: "server started again → first new request answered", notes: notes}, rs, cutAnswers(rs), tenantLoad, tenantAfter)
}
