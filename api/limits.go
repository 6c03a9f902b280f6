package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/request"
)

// ratesOf converts a tier's configured rates to the limiter's.
func ratesOf(t config.Tier) limiter.Policy {
	conv := func(r config.Rate) limiter.Rate {
		return limiter.Rate{TokensPerMinute: r.TokensPerMinute, TokenBurst: r.TokenBurst,
			RequestsPerMinute: r.RequestsPerMinute, RequestBurst: r.RequestBurst}
	}
	return limiter.Policy{Tenant: conv(t.Tenant), User: conv(t.User), IP: conv(t.IP)}
}

// reserve charges a request's estimated cost to every bucket of its
// caller before anything starts, and returns the reservation that gives
// back what the request does not use. It sets the rate-limit headers
// either way and returns a 429 or 413 when the request may not pass.
func (s *Server) reserve(ctx context.Context, c echo.Context, id string, who caller, tier config.Tier, enabled bool, cost int) (string, error) {
	if !enabled || s.limiter == nil {
		return "", nil
	}
	buckets := ratesOf(tier).Buckets(limiter.Caller{Tenant: who.Tenant, User: who.User, IP: s.addresses.Of(c.RealIP())}, float64(cost))
	d, err := s.limiter.Reserve(ctx, id, buckets)
	if err != nil {
		s.logger.Error("reserve rate limits", "requestID", id, "err", err)
		// The script may have charged before the reply was lost; the
		// request will not run, so give back whatever it took. In the
		// background: Redis just failed this call, and a first refund
		// attempt here would hold the client's 503 up by another
		// redis.request_timeout.
		go s.refundAll(ctx, id, d.Reservation)
		return "", unavailable("rate limiter unavailable")
	}
	setRateHeaders(c.Response().Header(), buckets, d)
	if d.Status == limiter.Allowed {
		s.metrics.RateLimit("all", true)
	} else {
		s.metrics.RateLimit(d.Bucket.Dimension, false)
	}
	switch d.Status {
	case limiter.TooLarge:
		b := d.Bucket
		return "", &apiError{Status: http.StatusRequestEntityTooLarge, Code: "request_too_large", Dimension: b.Dimension, Kind: string(b.Kind),
			Message: fmt.Sprintf("this request needs %d %s but the %s limit never holds more than %.0f; lower max_tokens or shorten the query",
				cost, b.Kind, b.Dimension, b.Capacity)}
	case limiter.Limited:
		b := d.Bucket
		retry := int(math.Ceil(d.RetryAfter.Seconds()))
		return "", &apiError{Status: http.StatusTooManyRequests, Code: request.ReasonRateLimited, Dimension: b.Dimension, Kind: string(b.Kind),
			RetryAfter: max(retry, 1),
			Message:    fmt.Sprintf("the %s %s limit is exhausted; retry in %ds", b.Dimension, b.Kind, max(retry, 1))}
	}
	return d.Reservation, nil
}

// setRateHeaders reports, per kind, the most constraining bucket: the one
// with the least left.
func setRateHeaders(h http.Header, buckets []limiter.Bucket, d limiter.Decision) {
	for _, kind := range []limiter.Kind{limiter.Tokens, limiter.Requests} {
		best := -1
		for i, b := range buckets {
			if b.Kind == kind && (best < 0 || d.Remaining[i] < d.Remaining[best]) {
				best = i
			}
		}
		if best < 0 {
			continue
		}
		suffix := "Tokens"
		if kind == limiter.Requests {
			suffix = "Requests"
		}
		h.Set("X-RateLimit-Limit-"+suffix, strconv.FormatFloat(buckets[best].Capacity, 'f', 0, 64))
		h.Set("X-RateLimit-Remaining-"+suffix, strconv.FormatFloat(math.Max(0, math.Floor(d.Remaining[best])), 'f', 0, 64))
		h.Set("X-RateLimit-Reset-"+suffix, formatReset(d.ResetAfter[best]))
	}
}

// formatReset writes a duration the way OpenAI's headers do ("1s", "6m0s").
func formatReset(d time.Duration) string {
	return d.Round(time.Millisecond).String()
}

// refundAll gives back a whole reservation, for a request that never
// started. It does not hold up the client's answer: with Redis stalled or
// gone, the refund is retried in the background until it is written or
// the reservation has expired by itself (refunds are idempotent).
func (s *Server) refundAll(ctx context.Context, id, reservation string) {
	if s.limiter == nil || reservation == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.refundPatience())
	refund := func(ctx context.Context) error {
		_, err := s.limiter.Refund(ctx, reservation, 0, 0)
		return err
	}
	first, stop := context.WithTimeout(ctx, s.cfg.Redis.RequestTimeout)
	err := refund(first)
	stop()
	if err == nil {
		cancel()
		return
	}
	go func() {
		defer cancel()
		if err := retry(ctx, func() error { return refund(ctx) }); err != nil {
			s.logger.Warn("refund rate limits: gave up; the charge refills with its bucket", "requestID", id, "err", err)
		}
	}()
}

// refundPatience is how long a refund is retried: as long as its
// reservation lives.
func (s *Server) refundPatience() time.Duration { return s.cfg.Admission.MaxWait + 10*time.Minute }

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
