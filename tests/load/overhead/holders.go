package overhead

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
)

// heldPool is the pool the scenarios that queue requests behind fake
// holders fill.
const heldPool = request.PoolShort

// heldFlags is the flag of those scenarios: the pool's permits, all of
// them held while requests queue.
type heldFlags struct {
	holders int
}

func (f *heldFlags) define(fs *flag.FlagSet, usage string) {
	fs.IntVar(&f.holders, "permits", 2, usage)
}

func (f heldFlags) configure(cfg *config.Config) { cfg.Pools.Short.MaxConcurrency = f.holders }

// hold takes all of the pool's permits.
func (f heldFlags) hold(ctx context.Context, st *stack.Stack) (*holders, error) {
	return holdPermits(ctx, st.Core.Gate, heldPool, f.holders)
}

// holders are fake permit holders: requests that took a pool's permits
// and keep them (renewing their leases, as a streaming request does) until
// the bench gives them back.
type holders struct {
	gate *admission.Gate
	pool string
	mu   sync.Mutex
	ids  []string
	seq  int
	stop context.CancelFunc
	done chan struct{}
}

// holdPermits takes n permits of pool, which must all be free.
func holdPermits(ctx context.Context, gate *admission.Gate, pool string, n int) (*holders, error) {
	h := &holders{gate: gate, pool: pool, done: make(chan struct{})}
	for i := 0; i < n; i++ {
		if err := h.Add(ctx); err != nil {
			h.ReleaseAll(ctx)
			return nil, err
		}
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	h.stop = stop
	go h.renew(rctx)
	return h, nil
}

// Add takes one more permit; it fails if none is free.
func (h *holders) Add(ctx context.Context) error {
	h.mu.Lock()
	h.seq++
	id := fmt.Sprintf("bench-holder-%d", h.seq)
	h.mu.Unlock()
	r, err := h.gate.Enqueue(ctx, h.pool, admission.Request{ID: id, Tenant: "bench-holders", Weight: 1})
	if err != nil {
		return err
	}
	if r.Status != admission.Granted {
		// Leave no entry behind.
		_, _ = h.gate.Release(context.WithoutCancel(ctx), h.pool, id)
		return fmt.Errorf("fake holder %s got %s, not a permit: pool %s is not idle", id, r.Status, h.pool)
	}
	h.mu.Lock()
	h.ids = append(h.ids, id)
	h.mu.Unlock()
	return nil
}

// Pop gives up the oldest holder's claim without releasing it: the caller
// releases it (and measures that).
func (h *holders) Pop() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := h.ids[0]
	h.ids = h.ids[1:]
	return id
}

// renew keeps the holders' leases alive, as a streaming request does.
func (h *holders) renew(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.gate.Lease() / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		ids := append([]string(nil), h.ids...)
		h.mu.Unlock()
		for _, id := range ids {
			_, _ = h.gate.Renew(ctx, h.pool, id)
		}
	}
}

// Stop ends renewal; the permits stay taken until released.
func (h *holders) Stop() {
	if h.stop != nil {
		h.stop()
		<-h.done
		h.stop = nil
	}
}

// ReleaseAll gives every remaining permit back and returns the requests
// the releases handed them to (to be woken).
func (h *holders) ReleaseAll(ctx context.Context) ([]admission.Grant, error) {
	h.Stop()
	h.mu.Lock()
	ids := h.ids
	h.ids = nil
	h.mu.Unlock()
	var woken []admission.Grant
	for _, id := range ids {
		rel, err := h.gate.Release(context.WithoutCancel(ctx), h.pool, id)
		if err != nil {
			return woken, err
		}
		woken = append(woken, rel.Woken...)
	}
	return woken, nil
}
