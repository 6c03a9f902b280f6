package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/keys"
)

// caller is who sent a request, and what its key lets it do.
type caller struct {
	Tenant, User, Tier string
	Scopes             keys.Scopes
	// KeyID names the key in logs and bans: a managed key's id, cfg_ and
	// the start of a configured key's hash; never the key itself. Empty
	// for anonymous callers.
	KeyID string
}

var errUnknownKey = &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "unknown or revoked API key"}

// authenticate names the caller from its API key (X-API-Key, or
// Authorization: Bearer), or as the anonymous tenant where allowed, and
// counts the request against the abuse bans of its IP and key: a banned
// caller is refused with 429 whatever else is wrong with the request.
func (s *Server) authenticate(c echo.Context) (caller, error) {
	who, authErr := s.identify(c)
	if err := s.checkBans(c, who.KeyID); err != nil {
		return caller{}, err
	}
	return who, authErr
}

// authenticateChat is authenticate for the routes that spend a model's
// time (chat, chat completions, embeddings): the key must hold the chat
// scope, so that a key made only to ingest cannot be spent on answers.
func (s *Server) authenticateChat(c echo.Context) (caller, error) {
	who, err := s.authenticate(c)
	if err != nil {
		return who, err
	}
	return who, who.needs(keys.ScopeChat, "ask for answers")
}

// needs refuses a caller whose key lacks scope; what says what the scope
// allows.
func (who caller) needs(scope keys.Scope, what string) error {
	if who.Scopes.Has(scope) {
		return nil
	}
	return &apiError{Status: http.StatusForbidden, Code: "missing_scope",
		Message: fmt.Sprintf("this API key may not %s: it lacks the %s scope", what, scope)}
}

func (s *Server) identify(c echo.Context) (caller, error) {
	key, err := presentedKey(c)
	if err != nil {
		return caller{}, err
	}
	if key == "" {
		if s.cfg.Auth.AllowAnonymous {
			// Anonymous callers share one tenant; the per-IP limits are
			// what tell them apart.
			// In the dev stack it may also ingest, so that the quick start
			// works without keys.
			return caller{Tenant: "anonymous", Tier: s.policy.Current().Limits.DefaultTier,
				Scopes: keys.Scopes{keys.ScopeChat, keys.ScopeIngest}}, nil
		}
		return caller{}, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "an API key is required (Authorization: Bearer <key>)"}
	}
	return s.callerOf(c.Request().Context(), key)
}

// presentedKey is the key a request carries, "" if none.
func presentedKey(c echo.Context) (string, error) {
	key := c.Request().Header.Get("X-API-Key")
	if auth := c.Request().Header.Get("Authorization"); key == "" && auth != "" {
		scheme, token, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			return "", &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "Authorization must be 'Bearer <api key>'"}
		}
		key = token
	}
	return key, nil
}

// callerOf looks a key up: among the configured keys (by hash, in
// memory), else among the managed keys (through the cache: Redis only on
// a miss).
func (s *Server) callerOf(ctx context.Context, key string) (caller, error) {
	hash := keys.Hash(key)
	var who caller
	if k, ok := s.keys[hash]; ok {
		who = caller{Tenant: k.Tenant, User: k.User, Tier: k.Tier, Scopes: k.Scopes, KeyID: "cfg_" + hash[:12]}
	} else {
		if s.keyCache == nil {
			return caller{}, errUnknownKey
		}
		ctx, cancel := context.WithTimeout(ctx, s.cfg.Redis.RequestTimeout)
		defer cancel()
		k, err := s.keyCache.Verify(ctx, key)
		switch {
		case errors.Is(err, keys.ErrMalformed), errors.Is(err, keys.ErrUnknown), errors.Is(err, keys.ErrRevoked):
			return caller{}, errUnknownKey
		case err != nil:
			s.logger.Warn("read API key", "err", err)
			return caller{}, unavailable("key store unavailable")
		}
		who = caller{Tenant: k.Tenant, User: k.User, Tier: k.Tier, Scopes: k.Scopes, KeyID: k.ID}
	}
	if who.User == "" {
		who.User = who.Tenant
	}
	// A managed key may name a tier the live policy has since dropped.
	live := s.policy.Current().Limits
	if _, ok := live.Tiers[who.Tier]; !ok {
		who.Tier = live.DefaultTier
	}
	return who, nil
}

// redisUnansweredKey marks a request (echo.Context) for which Redis just
// failed to answer within redis.request_timeout.
const redisUnansweredKey = "sluice.redis_unanswered"

// checkBans counts the request against its IP and key (one Redis call)
// and refuses it if either is banned, with the ban's remaining time as
// Retry-After.
func (s *Server) checkBans(c echo.Context, keyID string) error {
	if s.bans == nil {
		return nil
	}
	subjects := []ban.Subject{s.bans.IP(c.RealIP())}
	if keyID != "" {
		subjects = append(subjects, ban.Subject{Kind: ban.KindKey, Value: keyID})
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.Redis.RequestTimeout)
	defer cancel()
	v, err := s.bans.Hit(ctx, subjects...)
	if err != nil {
		// Open rather than closed: bans guard against floods, and the
		// rate limits, which do fail closed, still stand.
		s.logger.Warn("ban check failed; request let through", "err", err)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// Redis used up its redis.request_timeout: the door, which
			// needs it too, refuses at once rather than wait as long again.
			c.Set(redisUnansweredKey, true)
		}
		return nil
	}
	if !v.Banned {
		return nil
	}
	s.metrics.Banned(string(v.Kind), v.New)
	if v.New {
		b := s.cfg.Limits.Ban
		s.logger.Warn("banned for flooding", "kind", v.Kind, "value", v.Value, "for", b.Duration,
			"threshold", b.Threshold, "window", b.Window, "path", c.Path())
	}
	secs := int(math.Ceil(v.RetryAfter.Seconds()))
	what := "client address"
	if v.Kind == ban.KindKey {
		what = "API key"
	}
	return &apiError{Status: http.StatusTooManyRequests, Code: "banned", RetryAfter: secs,
		Message: fmt.Sprintf("this %s sent too many requests and is banned; retry in %ds", what, secs)}
}
