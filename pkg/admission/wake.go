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
	// Waiters waiting in their admission activity (Waker) go on at once;
	// the rest learn from the signal below.
	if err := g.Announce(ctx, ids); err != nil {
		errs = append(errs, err)
	}
	for len(ids) > 0 {
		id := ids[0]
		ids = ids[1:]
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
		if err := g.Announce(ctx, rel.Woken); err != nil {
			errs = append(errs, err)
		}
		ids = append(ids, rel.Woken...)
	}
	return errors.Join(errs...)
}
