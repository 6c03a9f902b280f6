package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/limiter"
)

// authenticateFor names the caller, as authenticate does, and charges the
// request to its tier's limit for route, per tenant and per client
// address: 429 with Retry-After when one is exhausted.
func (s *Server) authenticateFor(c echo.Context, route string) (caller, error) {
	who, err := s.authenticate(c)
	if err != nil {
		return who, err
	}
	return who, s.limitRoute(c, who, route)
}

// limitRoute charges one request against the route's buckets. These
// routes are cheap to refuse and matter less than the chat POSTs, so a
// limiter that cannot be reached lets them through (the bans still
// apply) rather than refuse them.
func (s *Server) limitRoute(c echo.Context, who caller, route string) error {
	live := s.policy.Current()
	if s.limiter == nil || !live.Limits.Enabled {
		return nil
	}
	tier, _ := live.Tier(who.Tier)
	rate := tier.Routes.Of(route)
	// Each route's buckets are apart from the chat's and each other's.
	buckets := limiter.Policy{
		Tenant: limiter.Rate{RequestsPerMinute: rate.TenantPerMinute},
		IP:     limiter.Rate{RequestsPerMinute: rate.IPPerMinute},
	}.Buckets(limiter.Caller{Tenant: route + ":" + who.Tenant, IP: route + ":" + s.addresses.Of(c.RealIP())}, 0)
	if len(buckets) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.Redis.RequestTimeout)
	defer cancel()
	d, err := s.limiter.Reserve(ctx, route, buckets)
	if err != nil {
		s.logger.Warn("route rate limit unavailable; letting the request through", "route", route, "err", err)
		return nil
	}
	setRateHeaders(c.Response().Header(), buckets, d)
	if d.Status == limiter.Allowed {
		return nil
	}
	s.metrics.RateLimit(d.Bucket.Dimension, false)
	retry := max(1, int(d.RetryAfter.Seconds()+0.999))
	return &apiError{Status: http.StatusTooManyRequests, Code: "rate_limited", Dimension: d.Bucket.Dimension, Kind: string(d.Bucket.Kind),
		RetryAfter: retry, Message: fmt.Sprintf("the %s limit on %s requests is exhausted; retry in %ds", d.Bucket.Dimension, route, retry)}
}
