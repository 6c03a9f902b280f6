package main

import (
	"context"
	"fmt"
	"time"
)

// poolsNow is the gate's permits in use and waiters over every pool, for
// a progress line: two Redis reads a pool.
func poolsNow(st *stack) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var inUse, waiting int
	for _, p := range st.rt.Gate.Pools() {
		qs, err := st.rt.Gate.QueueStats(ctx, p)
		if err != nil {
			return "pools=unknown"
		}
		inUse, waiting = inUse+qs.InUse, waiting+qs.Waiting
	}
	return fmt.Sprintf("in_use=%d queued=%d", inUse, waiting)
}

// watchMax is the most the simulator and the gate saw at once.
type watchMax struct {
	sim, inUse, waiting int64
}

// watch samples what the simulator and the gate see until stopped.
type watch struct {
	cancel context.CancelFunc
	done   chan struct{}
	max    watchMax
}

func startWatch(ctx context.Context, st *stack) *watch {
	wctx, cancel := context.WithCancel(ctx)
	w := &watch{cancel: cancel, done: make(chan struct{})}
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
			s := st.sim.Stats()
			w.max.sim = max(w.max.sim, int64(s.Running+s.Waiting))
			if i%10 == 0 {
				var inUse, waiting int64
				for _, p := range st.rt.Gate.Pools() {
					if gs, err := st.rt.Gate.Stats(wctx, p); err == nil {
						inUse += int64(gs.InUse)
						waiting += int64(gs.Waiting)
					}
				}
				w.max.inUse, w.max.waiting = max(w.max.inUse, inUse), max(w.max.waiting, waiting)
			}
		}
	}()
	return w
}

// stop ends the sampling and waits for it; w.max is read after.
func (w *watch) stop() {
	w.cancel()
	<-w.done
}
