package budget

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Status is a tenant's budget for the current month, as GET /v1/usage
// shows it.
type Status struct {
	Limit Limit
	// Used counts settled usage and the open reservations of requests
	// still running.
	Used     Used
	ResetsAt time.Time
}

// Status reads the tenant's month. A counter Redis does not hold is read
// from the ledger instead, without writing it (the next request does).
func (c *Counter) Status(ctx context.Context, tenant string, lim Limit) (Status, error) {
	start, next := Month(c.now())
	s := Status{Limit: lim, ResetsAt: next}
	vals, err := c.rdb.HMGet(ctx, c.key(tenant, start), "tokens", "micros").Result()
	if err != nil {
		return s, fmt.Errorf("read %s's budget: %w", tenant, err)
	}
	t, okT := vals[0].(string)
	m, okM := vals[1].(string)
	if okT && okM {
		tokens, err1 := strconv.ParseInt(t, 10, 64)
		micros, err2 := strconv.ParseInt(m, 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return s, fmt.Errorf("read %s's budget: %w", tenant, err)
		}
		s.Used = Used{Tokens: tokens, Micros: micros}
		return s, nil
	}
	if c.rebuild != nil {
		if s.Used, err = c.rebuild(ctx, tenant, start, next); err != nil {
			return s, fmt.Errorf("read %s's budget from the ledger: %w", tenant, err)
		}
	}
	return s, nil
}
