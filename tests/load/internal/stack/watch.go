package stack

import (
	"context"
	"fmt"
	"time"
)

// PoolsNow is the gate's permits in use and waiters over every pool, for
// a progress line: two Redis reads a pool.
func (s *Stack) PoolsNow() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var inUse, waiting int
	for _, p := range s.Core.Gate.Pools() {
		qs, err := s.Core.Gate.QueueStats(ctx, p)
		if err != nil {
			return "pools=unknown"
		}
		inUse, waiting = inUse+qs.InUse, waiting+qs.Waiting
	}
	return fmt.Sprintf("in_use=%d queued=%d", inUse, waiting)
}

// WatchMax is the most the simulator and the gate saw at once.
type WatchMax struct {
	Sim, InUse, Waiting int64
}

// Watch samples what the simulator and the gate see until stopped.
type Watch struct {
	cancel context.CancelFunc
	done   chan struct{}
	Max    WatchMax
}

// StartWatch samples what the simulator and the gate of st see, until
// Stop.
func StartWatch(ctx context.Context, st *Stack) *Watch {
	wctx, cancel := context.WithCancel(ctx)
	w := &Watch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			s := st.Sim.Stats()
			w.Max.Sim = max(w.Max.Sim, int64(s.Running+s.Waiting))
			if i%10 == 0 {
				var inUse, waiting int64
				for _, p := range st.Core.Gate.Pools() {
					if gs, err := st.Core.Gate.Stats(wctx, p); err == nil {
						inUse += int64(gs.InUse)
						waiting += int64(gs.Waiting)
					}
				}
				w.Max.InUse, w.Max.Waiting = max(w.Max.InUse, inUse), max(w.Max.Waiting, waiting)
			}
		}
	}()
	return w
}

// Stop ends the sampling and waits for it; w.max is read after.
func (w *Watch) Stop() {
	w.cancel()
	<-w.done
}
