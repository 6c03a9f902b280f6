package door

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// RatesOf is a tier's rates in the limiter's terms.
func RatesOf(t policy.Tier) limiter.Policy {
	conv := func(r policy.Rate) limiter.Rate {
		return limiter.Rate{TokensPerMinute: r.TokensPerMinute, TokenBurst: r.TokenBurst,
			RequestsPerMinute: r.RequestsPerMinute, RequestBurst: r.RequestBurst}
	}
	return limiter.Policy{Tenant: conv(t.Tenant), User: conv(t.User), IP: conv(t.IP)}
}

// reserve charges a request's estimated cost to every bucket of its
// Caller before anything starts, and returns the reservation that gives
// back what the request does not use. It notes the buckets in st either
// way and refuses (Limited, TooLarge) a request that may not pass.
func (d *Door) reserve(ctx context.Context, st *Standing, id string, who Caller, tier policy.Tier, enabled bool, cost int) (string, error) {
	if !enabled || d.limiter == nil {
		return "", nil
	}
	buckets := RatesOf(tier).Buckets(limiter.Caller{Tenant: who.Tenant, User: who.User, IP: d.addresses.ClientOf(who.IP)}, float64(cost))
	dec, err := d.limiter.Reserve(ctx, id, buckets)
	if err != nil {
		d.logger.Error("reserve rate limits", "requestID", id, "err", err)
		// The script may have charged before the reply was lost; the
		// request will not run, so give back whatever it took. In the
		// background: Redis just failed this call, and a first refund
		// attempt here would hold the client's 503 up by another
		// redis.request_timeout.
		go d.refundAll(ctx, id, dec.Reservation)
		return "", refusal.Unreachable("rate limiter unavailable")
	}
	st.noteRates(buckets, dec)
	if dec.Status == limiter.Allowed {
		d.metrics.RateLimit("all", true)
	} else {
		d.metrics.RateLimit(dec.Bucket.Dimension, false)
	}
	switch dec.Status {
	case limiter.TooLarge:
		b := dec.Bucket
		return "", &refusal.Error{Class: refusal.TooLarge, Code: "request_too_large", Dimension: b.Dimension, Kind: string(b.Kind),
			Message: fmt.Sprintf("this request needs %d %s but the %s limit never holds more than %.0f; lower max_tokens or shorten the query",
				cost, b.Kind, b.Dimension, b.Capacity)}
	case limiter.Limited:
		b := dec.Bucket
		d.refusedWithRetry(ctx, who, dec.RetryAfter, "rate limit")
		retry := request.RetryAfterSeconds(dec.RetryAfter)
		return "", &refusal.Error{Class: refusal.Limited, Code: request.ReasonRateLimited, Dimension: b.Dimension, Kind: string(b.Kind),
			RetryAfter: retry, Message: fmt.Sprintf("the %s %s limit is exhausted; retry in %ds", b.Dimension, b.Kind, retry)}
	}
	return dec.Reservation, nil
}

// refundAll gives back a whole reservation, for a request that never
// started (refunds are idempotent; see giveBackSoon).
func (d *Door) refundAll(ctx context.Context, id, reservation string) {
	if d.limiter == nil || reservation == "" {
		return
	}
	d.giveBackSoon(ctx, id, "refund rate limits: gave up; the charge refills with its bucket", func(ctx context.Context) error {
		_, err := d.limiter.Refund(ctx, reservation, 0, 0)
		return err
	})
}

// giveBackSoon runs giveBack, an idempotent write that returns what a
// request that never started was charged, without holding up the client's
// answer: one try within the Redis request timeout, then, with Redis
// stalled or gone, retries in the background until it is written or the
// refund patience runs out, when it logs gaveUp.
func (d *Door) giveBackSoon(ctx context.Context, id, gaveUp string, giveBack func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.refundPatience())
	first, stop := context.WithTimeout(ctx, d.cfg.Redis.RequestTimeout)
	err := giveBack(first)
	stop()
	if err == nil {
		cancel()
		return
	}
	go func() {
		defer cancel()
		if err := retry(ctx, func() error { return giveBack(ctx) }); err != nil {
			d.logger.Warn(gaveUp, "requestID", id, "err", err)
		}
	}()
}

// refundPatience is how long a refund is retried: as long as its
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

// Charge is what a request outside the chat path (an embeddings call)
// was charged to its caller's token buckets.
type Charge struct {
	// ID names the request in logs and in its reservation.
	ID          string
	reservation string
}

// ChargeTokens charges tokens to the caller's buckets, as Admit charges a
// chat request, and tells where the caller stands: refused (Limited,
// TooLarge) when the request may not pass. Refund gives the charge back
// when nothing was served.
func (d *Door) ChargeTokens(ctx context.Context, who Caller, tokens int) (Charge, Standing, error) {
	live := d.policy.Current()
	tier, _ := live.Tier(who.Tier)
	ch := Charge{ID: "emb-" + strings.TrimPrefix(NewRequestID(), "chat-")}
	cost := 0
	if live.Limits.Enabled && RatesOf(tier).CountsTokens() {
		cost = tokens
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Redis.RequestTimeout)
	defer cancel()
	var st Standing
	var err error
	ch.reservation, err = d.reserve(ctx, &st, ch.ID, who, tier, live.Limits.Enabled, cost)
	return ch, st, err
}

// Refund gives a whole charge back.
func (d *Door) Refund(ctx context.Context, ch Charge) { d.refundAll(ctx, ch.ID, ch.reservation) }
