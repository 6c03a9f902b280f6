package chaos

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/tests/settle"
)

// settleBound is how long the stack may take, after a scenario's load
// ended, to give back every permit and queue place and finish every
// request: a dead holder's lease (5 s) and a disconnect grace (1 s), with
// room for a two-core machine busy with other work.
const settleBound = time.Minute

// leftovers checks what Sluice promises to leave behind a fault once its
// requests have ended: no permit held, no queue entry, no chat workflow
// running, and every reservation of the given tenants refunded exactly
// once. It returns what was lost ("" entries are not added): empty means
// nothing.
func (s *stack) leftovers(ctx context.Context, tenants ...string) []string {
	var lost []string
	if err := settle.PoolsIdle(ctx, s.gate, settleBound); err != nil {
		lost = append(lost, err.Error())
	}
	n, err := settle.RunningChats(ctx, s.tc, s.cfg.Temporal.Namespace, settleBound)
	switch {
	case err != nil:
		lost = append(lost, err.Error())
	case n > 0:
		lost = append(lost, fmt.Sprintf("%d chat workflows still running after %s", n, settleBound))
	}
	for _, tenant := range tenants {
		lost = append(lost, s.unsettled(ctx, tenant)...)
	}
	left, err := s.reservationsLeft(ctx)
	switch {
	case err != nil:
		lost = append(lost, err.Error())
	case left > 0:
		lost = append(lost, fmt.Sprintf("%d reservations never refunded (still in the limiter's hashes)", left))
	}
	return lost
}

// unsettled checks one tenant's reservations against its requests' bills.
// A door refund may still be retried in the background, so a gap is given
// a few seconds to close.
func (s *stack) unsettled(ctx context.Context, tenant string) []string {
	a, err := s.tenantAccounts(ctx, tenant)
	if err != nil {
		return []string{fmt.Sprintf("tenant %s: %v", tenant, err)}
	}
	var lost []string
	if len(a.unrefunded) > 0 {
		lost = append(lost, fmt.Sprintf("tenant %s: %d requests kept their whole charge (no refund): %s",
			tenant, len(a.unrefunded), strings.Join(first(a.unrefunded, 5), ", ")))
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		gt, gr, err := s.bucketGap(ctx, tenant, a.billed)
		if err != nil {
			return append(lost, err.Error())
		}
		// A bucket refills 0.001 a minute, so a settled one is within
		// a hundredth of a token of its bill.
		if math.Abs(gt) < 0.01 && math.Abs(gr) < 0.01 {
			return lost
		}
		if time.Now().After(deadline) {
			return append(lost, fmt.Sprintf("tenant %s (%d requests): buckets lack %.3f tokens and %.3f requests beyond what the requests were billed (negative: refunded more than charged)",
				tenant, a.requests, gt, gr))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func first(xs []string, n int) []string {
	if len(xs) > n {
		return append(xs[:n:n], "…")
	}
	return xs
}
