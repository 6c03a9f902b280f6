package admission

import (
	"context"
	"errors"
	"fmt"
)

// ErrWaiterGone is returned by a Notifier when the waiter no longer exists
// (its workflow ended); the permit it was granted must be given back.
var ErrWaiterGone = errors.New("waiter gone")

// Notifier tells a waiter that it now holds a permit.
type Notifier interface {
	NotifyGranted(ctx context.Context, pool, requestID string) error
}

// Wake notifies every request in ids that it was granted a permit in pool.
// A waiter that is gone gets its permit released, which may grant the next
// waiter in turn; Wake follows that chain so no permit is stranded. Other
// notification errors are returned, but the permit stays granted: the
// waiter's own re-check finds it, or its lease runs out.
func Wake(ctx context.Context, g *Gate, n Notifier, pool string, ids []string) error {
	var errs []error
	for len(ids) > 0 {
		// Waiters waiting in their admission activity (Waker) hear of it
		// on the grant channel, the others by a signal.
		var fast, slow []string
		for _, id := range ids {
			claimed, err := g.claimFast(ctx, id)
			if err != nil {
				errs = append(errs, err)
			}
			if claimed {
				fast = append(fast, id)
			} else {
				slow = append(slow, id)
			}
		}
		ids = nil
		if err := g.announce(ctx, fast); err != nil {
			errs = append(errs, err)
		}
		for _, id := range slow {
			err := n.NotifyGranted(ctx, pool, id)
			if err == nil {
				continue
			}
			if !errors.Is(err, ErrWaiterGone) {
				errs = append(errs, fmt.Errorf("notify %s of its permit: %w", id, err))
				continue
			}
			rel, err := g.Release(ctx, pool, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			ids = append(ids, rel.Woken...)
		}
	}
	return errors.Join(errs...)
}
