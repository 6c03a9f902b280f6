package admission

import (
	"context"
	"fmt"
	"math"
	"strconv"
)

// Charge charges requestID's tenant, in pool's fair order, for the
// output its stream has produced so far: cost is the cost of all of it
// (TokenCost of its output tokens, each weighted as the request's charge
// weighted them), not of the tokens since the last call. Only what cost
// is beyond what the request was already charged for its output is
// charged, so a repeated call, or a resumed attempt that counts the
// tokens of the attempt before it, never charges a token twice; what a
// stream produced after its last charge is settled by its release
// (ReleaseUsed). The charge moves the tenant's waiting entries and places
// later by as much. A request that holds no permit of the pool, or whose
// entry was charged its bound up front, is not charged. It returns the
// ticks of virtual time charged now (0: nothing).
func (g *Gate) Charge(ctx context.Context, pool, requestID string, cost float64) (int64, error) {
	if _, err := g.limit(pool); err != nil {
		return 0, err
	}
	if !(cost >= 0) || math.IsInf(cost, 0) {
		return 0, fmt.Errorf("charge %s in pool %s: cost must be >= 0, got %v", requestID, pool, cost)
	}
	n, err := chargeScript.Run(ctx, g.rdb, g.scriptKeys(pool), requestID, strconv.FormatFloat(cost, 'g', -1, 64)).Int64()
	if err != nil {
		return 0, fmt.Errorf("charge %s in pool %s for its output: %w", requestID, pool, err)
	}
	return n, nil
}

// Shifts reads each tenant's shift in pool's fair order: the ticks its
// streams were charged since it was last idle, by which the places it
// reserved at the door have moved (request.Place.Shift holds the shift
// when each was reserved). The door's waiting room lines its waiters up
// by it.
func (g *Gate) Shifts(ctx context.Context, pool string) (map[string]int64, error) {
	if _, err := g.limit(pool); err != nil {
		return nil, err
	}
	raw, err := g.cmd.HGetAll(ctx, g.keys(pool).shift).Result()
	if err != nil {
		return nil, fmt.Errorf("read the tenants' shifts in pool %s: %w", pool, err)
	}
	out := make(map[string]int64, len(raw))
	for tenant, v := range raw {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("read the tenants' shifts in pool %s: tenant %s: %w", pool, tenant, err)
		}
		out[tenant] = n
	}
	return out, nil
}
