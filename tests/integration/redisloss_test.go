package integration

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// A Redis that loses the admission state (it restarted empty) while a
// request waits for a permit: the janitor notices, asks the running
// requests to re-check, and the waiter comes back at its old place and is
// served, long before its 45 s max wait would have run out.
func TestWaiterComesBackAfterRedisLostTheQueue(t *testing.T) {
	holdShortPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := open(t, ctx, http.MethodPost, "/v1/chat", `{"query":"What happens to waiters when Redis restarts?","max_tokens":8}`,
		map[string]string{"Authorization": "Bearer k-burst"})
	defer s.close()
	s.until(t, func(ev testenv.SSEEvent) bool { return ev.Event == events.TypeQueue })
	waitForTimer(t, ctx, s.id)

	// Every admission key goes, the holders' permits and the waiter's
	// place with them, and the sentinel that tells the janitor.
	start := time.Now()
	keys, err := stack.redis.Keys(ctx, keyPrefix+"adm*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("admission keys %v %v", keys, err)
	}
	if err := stack.redis.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	evs := s.until(t, terminal)
	if last := evs[len(evs)-1]; last.Event != events.TypeDone {
		t.Fatalf("ended with %+v", last)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("served %v after Redis lost the queue: it waited for its deadline", took)
	}
	if r := result(t, s.id); r.Outcome != request.OutcomeDone {
		t.Fatalf("outcome %q", r.Outcome)
	}
	assertPoolsIdle(t)
}
