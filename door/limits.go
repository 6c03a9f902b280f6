package door

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/pkg/holdings"
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
		go d.giveBack(ctx, holdings.Holdings{RequestID: id, Rate: dec.Reservation})
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
func (d *Door) Refund(ctx context.Context, ch Charge) {
	d.giveBack(ctx, holdings.Holdings{RequestID: ch.ID, Rate: ch.reservation})
}
