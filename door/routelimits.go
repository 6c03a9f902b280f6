package door

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// LimitRoute charges one request of route (a policy.Route*) against its
// tier's buckets for that route, per tenant and per client address, and
// tells where the caller stands: refused (Limited, with Retry-After) when
// one is exhausted. These routes are cheap to refuse and matter less than
// the chat POSTs, so a limiter that cannot be reached lets them through
// (the bans still apply) rather than refuse them.
func (d *Door) LimitRoute(ctx context.Context, who Caller, route string) (Standing, error) {
	var st Standing
	live := d.policy.Current()
	if d.limiter == nil || !live.Limits.Enabled {
		return st, nil
	}
	tier, _ := live.Tier(who.Tier)
	rate := tier.Routes.Of(route)
	// Each route's buckets are apart from the chat's and each other's.
	buckets := limiter.Policy{
		Tenant: limiter.Rate{RequestsPerMinute: rate.TenantPerMinute},
		IP:     limiter.Rate{RequestsPerMinute: rate.IPPerMinute},
	}.Buckets(limiter.Caller{Tenant: route + ":" + who.Tenant, IP: route + ":" + d.addresses.ClientOf(who.IP)}, 0)
	if len(buckets) == 0 {
		return st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Redis.RequestTimeout)
	defer cancel()
	dec, err := d.limiter.Reserve(ctx, route, buckets)
	if err != nil {
		d.logger.Warn("route rate limit unavailable; letting the request through", "route", route, "err", err)
		return st, nil
	}
	st.noteRates(buckets, dec)
	if dec.Status == limiter.Allowed {
		return st, nil
	}
	d.metrics.RateLimit(dec.Bucket.Dimension, false)
	d.refusedWithRetry(ctx, who, dec.RetryAfter, route)
	retry := request.RetryAfterSeconds(dec.RetryAfter)
	return st, &refusal.Error{Class: refusal.Limited, Code: "rate_limited", Dimension: dec.Bucket.Dimension, Kind: string(dec.Bucket.Kind),
		RetryAfter: retry, Message: fmt.Sprintf("the %s limit on %s requests is exhausted; retry in %ds", dec.Bucket.Dimension, route, retry)}
}
