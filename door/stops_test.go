package door

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// The watch tells exactly the waiters whose flag is raised, polls only
// while someone is watched, and starts again for the next watcher.
func TestStopWatchTellsOnlyTheStoppedWaiters(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.StartRedis(t).Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	log := events.NewLog(rdb, events.LogOptions{KeyPrefix: testenv.KeyPrefix(t), TTL: time.Minute, MaxLen: 100})
	s := newStopWatch(log, 10*time.Millisecond, time.Second, slog.New(slog.DiscardHandler))

	a, unwatchA := s.watch("a")
	b, unwatchB := s.watch("b")
	defer unwatchB()
	// stopSeen raises id's flag and waits for its channel to close.
	stopSeen := func(id string, ch <-chan struct{}, why string) {
		t.Helper()
		if err := log.Stop(ctx, id, time.Minute); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal(why)
		}
	}
	stopSeen("a", a, "a's stop was not seen")
	unwatchA() // after the close: does nothing
	select {
	case <-b:
		t.Fatal("b was told of a's stop")
	case <-time.After(50 * time.Millisecond):
	}
	unwatchB()
	for polling, end := true, time.Now().Add(5*time.Second); polling; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("polling went on with nobody watched")
		}
		s.mu.Lock()
		polling = s.polling
		s.mu.Unlock()
	}

	c, unwatchC := s.watch("c")
	defer unwatchC()
	stopSeen("c", c, "a watch after polling ended was not polled")
}
