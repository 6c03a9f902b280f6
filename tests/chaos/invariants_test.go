package chaos

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/tests/settle"
)

// settleBound is how long the stack may take, after a scenario's load
// ended, to give back every permit and queue place and finish every
// request: a dead holder's lease (5 s) and a disconnect grace (1 s), with
// room for a two-core machine busy with other work.
const settleBound = time.Minute

// leftovers is what the stack left behind once a scenario's requests
// ended (settle.Accounts.Leftovers): empty means nothing.
func (s *stack) leftovers(ctx context.Context, tenants ...string) []string {
	return s.accounts().Leftovers(ctx, s.gate, settleBound, tenants...)
}

// accounts checks the chaos tier's buckets (see chaosConfig).
func (s *stack) accounts() *settle.Accounts {
	return &settle.Accounts{TC: s.tc, RDB: s.rdb, Namespace: s.cfg.Temporal.Namespace, KeyPrefix: s.cfg.Redis.KeyPrefix,
		TokenCapacity: tokenCapacity, RequestCapacity: requestCapacity}
}
