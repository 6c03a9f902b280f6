package admission

import (
	"context"
	"errors"
	"fmt"
)

// Notifier tells a waiter that it now holds a permit. gone reports a
// waiter that no longer exists (its workflow ended): the permit it was
// granted must be given back.
type Notifier interface {
	NotifyGranted(ctx context.Context, pool, requestID string) (gone bool, err error)
}

// Wake notifies every request granted a permit in grants (each in its
// pool).
// A waiter that is gone gets its permit released, which may grant the next
// waiter in turn; Wake follows that chain so no permit is stranded. Other
// notification errors are returned, but the permit stays granted: the
// waiter's own re-check finds it, or its lease runs out.
func Wake(ctx context.Context, g *Gate, n Notifier, grants []Grant) error {
	var errs []error
	for len(grants) > 0 {
		// Waiters waiting in their admission activity (Waker) hear of it
		// on the grant channel, the others by a signal.
		var fast []string
		var slow []Grant
		for _, gr := range grants {
			claimed, err := g.claimFast(ctx, gr.ID)
			if err != nil {
				errs = append(errs, err)
			}
			if claimed {
				fast = append(fast, gr.ID)
			} else {
				slow = append(slow, gr)
			}
		}
		grants = nil
		if err := g.announce(ctx, fast); err != nil {
			errs = append(errs, err)
		}
		for _, gr := range slow {
			pool, id := gr.Pool, gr.ID
			gone, err := n.NotifyGranted(ctx, pool, id)
			if err != nil {
				errs = append(errs, fmt.Errorf("notify %s of its permit: %w", id, err))
				continue
			}
			if !gone {
				continue
			}
			rel, err := g.Release(ctx, pool, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			grants = append(grants, rel.Woken...)
		}
	}
	return errors.Join(errs...)
}

// ErrNotWoken marks a ReleaseAndWake whose release went through but whose
// wake-up of a granted waiter failed: the permit is that waiter's all the
// same, and its look at the queue at its deadline, or the pump reclaiming
// the unclaimed lease, recovers it. Callers log it; they need not retry.
var ErrNotWoken = errors.New("released, but a granted waiter was not woken")

// ReleaseAndWake gives back requestID's permit or queue place in pool and
// wakes the waiters that frees (Wake): the one way the end of a request
// hands its permit on. The release is idempotent, so a retried or racing
// caller frees one place. A failed release is returned as is (nothing was
// given back); a failed wake-up wraps ErrNotWoken.
func (g *Gate) ReleaseAndWake(ctx context.Context, n Notifier, pool, requestID string) (Released, error) {
	return g.ReleaseUsedAndWake(ctx, n, pool, requestID, 0)
}

// ReleaseUsedAndWake is ReleaseAndWake of a request that used cost
// (ReleaseUsed).
func (g *Gate) ReleaseUsedAndWake(ctx context.Context, n Notifier, pool, requestID string, cost float64) (Released, error) {
	rel, err := g.ReleaseUsed(ctx, pool, requestID, cost)
	if err != nil {
		return rel, err
	}
	if err := Wake(ctx, g, n, rel.Woken); err != nil {
		return rel, fmt.Errorf("%w: %w", ErrNotWoken, err)
	}
	return rel, nil
}
