package door

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
)

// holdings is what a that never started holds: its place in its pool's
// fair order, its rate-limit reservation and its budget charge.
func (a arrival) holdings() holdings.Holdings {
	return holdings.Holdings{RequestID: a.id, Place: a.place, Rate: a.reservation, Budget: a.budget}
}

// dropUnstarted undoes a request that the door accepted but never started:
// its event stream is deleted, or, when it claimed an idempotency key
// (whoever attached with the key meanwhile reads it), ended and the key
// given back for the client's retry; and what it holds is given back.
func (d *Door) dropUnstarted(ctx context.Context, a arrival) {
	h := a.holdings()
	if a.key == nil {
		_ = d.events.Delete(context.WithoutCancel(ctx), a.id)
	} else {
		d.endUnstarted(ctx, a.id)
		h.Key = a.key
	}
	d.giveBack(ctx, h)
}

// endUnstarted ends the stream of a request whose workflow could not be
// started, for whoever attached to it by its idempotency key. Its client
// is refused at once, so the end gets one try of redis.request_timeout:
// with Redis down, the key's retention runs out.
func (d *Door) endUnstarted(ctx context.Context, id string) {
	if err := d.writeEnd(context.WithoutCancel(ctx), id, events.TypeError, startFailure, d.cfg.Redis.RequestTimeout); err != nil {
		d.logger.Warn("end the stream of a request that could not be started", "requestID", id, "err", err)
	}
}

// giveBack returns h, held by a request that never started (so it used
// nothing), without holding up the client's answer: one try within the
// Redis request timeout, then, with Redis stalled or gone, what is still
// held is retried in the background until it is given back or the refund
// patience runs out (holdings.Returner.GiveBack: every step but the
// place's is idempotent, and a place is tried once).
func (d *Door) giveBack(ctx context.Context, h holdings.Holdings) {
	used := holdings.Used{Rate: &holdings.RateUse{}}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.refundPatience())
	first, stop := context.WithTimeout(ctx, d.cfg.Redis.RequestTimeout)
	rest, err := d.returner.GiveBack(first, h, used)
	stop()
	if err == nil {
		cancel()
		return
	}
	go func() {
		defer cancel()
		err := retry(ctx, func() error {
			var err error
			rest, err = d.returner.GiveBack(ctx, rest, used)
			return err
		})
		if err != nil {
			d.logger.Warn("give back what a request that never started held: gave up (a rate charge refills with its bucket, a budget charge stays in its month)",
				"requestID", h.RequestID, "err", err)
		}
	}()
}

// refundPatience is how long a give-back is retried: as long as a rate
// reservation lives.
func (d *Door) refundPatience() time.Duration { return d.cfg.Admission.MaxWait + 10*time.Minute }

// retry calls f until it succeeds or ctx ends, backing off from 100 ms to
// 5 s between calls.
func retry(ctx context.Context, f func() error) error {
	wait := 100 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}
