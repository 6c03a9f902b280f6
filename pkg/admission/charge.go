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
