package admission

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
)

// Reserve takes a place in pool's fair order for a request of tenant at
// weight and cost that waits at the door, as if it queued now: its
// tenant's later requests queue after it, and a tenant that asked less
// goes ahead of it, wherever the requests wait (the door's waiting room
// or the queue). Without it, the door's crowd and the queue are two
// orders on two clocks, and a tenant whose requests reach the queue one
// at a time is placed as if it had asked for nothing. A place neither
// taken nor given back lapses after ttl (its door died). It returns the
// place and how many queued entries are ahead of it.
func (g *Gate) Reserve(ctx context.Context, pool, tenant string, weight int, cost float64, ttl time.Duration) (request.Place, int, error) {
	if _, err := g.limit(pool); err != nil {
		return request.Place{}, 0, err
	}
	if cost == 0 {
		cost = 1
	}
	if weight <= 0 || !(cost > 0) || ttl <= 0 {
		return request.Place{}, 0, fmt.Errorf("reserve a place in pool %s: weight %d, cost %v and ttl %s must be > 0", pool, weight, cost, ttl)
	}
	raw, err := reserveScript.Run(ctx, g.rdb, g.scriptKeys(pool), tenant, weight, strconv.FormatFloat(cost, 'g', -1, 64),
		ttl.Milliseconds()).Int64Slice()
	if err != nil {
		return request.Place{}, 0, fmt.Errorf("reserve a place in pool %s for tenant %s: %w", pool, tenant, err)
	}
	if len(raw) != 4 {
		return request.Place{}, 0, fmt.Errorf("reserve a place in pool %s: reply %v", pool, raw)
	}
	return request.Place{Pool: pool, Tenant: tenant, Weight: weight, Cost: cost, Tag: raw[0], Charge: raw[2], Shift: raw[3]}, int(raw[1]), nil
}

// Unreserve gives back a place whose request never queued (it ended at
// the door). A place its request queued at is already taken: give back
// only those.
func (g *Gate) Unreserve(ctx context.Context, p request.Place) error {
	if p.Tag == 0 {
		return nil
	}
	err := unreserveScript.Run(ctx, g.rdb, g.scriptKeys(p.Pool), p.Tenant, p.Tag, p.Weight,
		strconv.FormatFloat(p.Cost, 'g', -1, 64), p.Charge, p.Shift).Err()
	if err != nil {
		return fmt.Errorf("give back place %d in pool %s of tenant %s: %w", p.Tag, p.Pool, p.Tenant, err)
	}
	return nil
}

// AheadOf returns how many requests queued in the place's group are ahead
// of it in the fair order.
func (g *Gate) AheadOf(ctx context.Context, p request.Place) (int, error) {
	n, err := aheadScript.Run(ctx, g.rdb, g.scriptKeys(p.Pool), p.Tenant, p.Weight,
		strconv.FormatFloat(p.Cost, 'g', -1, 64), p.Tag, p.Shift).Int()
	if err != nil {
		return 0, fmt.Errorf("entries ahead of place %d in pool %s: %w", p.Tag, p.Pool, err)
	}
	return n, nil
}
