package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/limiter"
)

// The batched reserve and the refund, with a tenant's and an address's
// buckets in different slots: many callers at once through the
// coalescing batchers, a refusal by the address after the tenant was
// charged (and given back), and refunds of reservations of two parts.
func TestLimiter(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	l := limiter.New(rdb, limiter.Options{KeyPrefix: prefix, ReservationTTL: time.Minute, Batchers: 2, MaxBatch: 16})
	defer l.Close()
	p := limiter.Policy{
		// Ten tokens a second: a charge not given back would show.
		Tenant: limiter.Rate{TokensPerMinute: 600, TokenBurst: 1e5, RequestsPerMinute: 1e4},
		User:   limiter.Rate{TokensPerMinute: 600, TokenBurst: 1e5},
		IP:     limiter.Rate{RequestsPerMinute: 0.06, RequestBurst: 1}, // one request, then refused for a long while
	}
	var wg sync.WaitGroup
	reservations := make([]string, 24)
	for i := range reservations {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := limiter.Caller{Tenant: fmt.Sprint("t", i%4), User: fmt.Sprint("u", i%3), IP: fmt.Sprint("10.0.0.", i)}
			d, err := l.Reserve(ctx, fmt.Sprint("r", i), p.Buckets(c, 100))
			if err != nil {
				t.Errorf("reserve %d (keys in more than one slot: %v): %v", i, crossSlot(err), err)
				return
			}
			if d.Status != limiter.Allowed || strings.Count(d.Reservation, "\n\n") != 1 {
				t.Errorf("request %d: %+v, want allowed with a reservation of two parts", i, d)
			}
			reservations[i] = d.Reservation
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// 10.0.0.0 has used its one request: the tenant's charge comes back.
	c := limiter.Caller{Tenant: "t0", User: "u0", IP: "10.0.0.0"}
	before, err := l.Reserve(ctx, "probe", p.Buckets(limiter.Caller{Tenant: "t0"}, 0))
	ok(t, "read t0", err)
	d, err := l.Reserve(ctx, "refused", p.Buckets(c, 100))
	ok(t, "reserve past the address's limit", err)
	if d.Status != limiter.Limited || d.Bucket == nil || d.Bucket.Dimension != "ip" || d.Reservation != "" {
		t.Fatalf("refused: %+v, want limited by the ip bucket with nothing to refund", d)
	}
	after, err := l.Reserve(ctx, "probe", p.Buckets(limiter.Caller{Tenant: "t0"}, 0))
	ok(t, "read t0 again", err)
	// Tokens: the refused request's 100 came back (both probes cost 0
	// tokens); requests: each probe took one.
	if got, was := after.Remaining[0], before.Remaining[0]; got < was-0.01 {
		t.Fatalf("t0 has %v tokens after a request the address refused, had %v: its charge was not given back", got, was)
	}
	for i, r := range reservations {
		refunded, err := l.Refund(ctx, r, 10, 1)
		ok(t, "refund", err)
		if !refunded {
			t.Fatalf("reservation %d was not refunded", i)
		}
	}
}
