package api

import (
	"context"
	"errors"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

var errUnknownKey = &refusal.Error{Class: refusal.Unauthenticated, Code: "unauthorized", Message: "unknown or revoked API key"}

// authenticate names the caller from its API key (X-API-Key, or
// Authorization: Bearer), or as the anonymous tenant where allowed, and
// counts the request against the abuse bans of its IP and key: a banned
// caller is refused with 429 whatever else is wrong with the request.
func (s *Server) authenticate(c echo.Context) (door.Caller, error) {
	who, authErr := s.identify(c)
	if err := s.checkBans(c, &who, authErr); err != nil {
		return door.Caller{}, err
	}
	return who, authErr
}

// refusedCredential reports a credential refused as bad or unknown (401):
// what a client guessing keys gets. A key store that could not answer
// (503) is not the client's doing.
func refusedCredential(err error) bool {
	var ae *refusal.Error
	return errors.As(err, &ae) && ae.Class == refusal.Unauthenticated
}

// authenticateChat is authenticate for the routes that spend a model's
// time (chat, chat completions, embeddings): the key must hold the chat
// scope, so that a key made only to ingest cannot be spent on answers.
func (s *Server) authenticateChat(c echo.Context) (door.Caller, error) {
	who, err := s.authenticate(c)
	if err != nil {
		return who, err
	}
	return who, who.Needs(keys.ScopeChat, "ask for answers")
}

func (s *Server) identify(c echo.Context) (door.Caller, error) {
	key, err := presentedKey(c)
	if err != nil {
		return door.Caller{}, err
	}
	if key == "" {
		if s.cfg.Auth.AllowAnonymous {
			// Anonymous callers share one tenant; the per-IP limits are
			// what tell them apart.
			// In the dev stack it may also ingest, so that the quick start
			// works without keys.
			return door.Caller{Tenant: "anonymous", Tier: s.policy.Current().Limits.DefaultTier,
				Scopes: keys.Scopes{keys.ScopeChat, keys.ScopeIngest}}, nil
		}
		return door.Caller{}, &refusal.Error{Class: refusal.Unauthenticated, Code: "unauthorized", Message: "an API key is required (Authorization: Bearer <key>)"}
	}
	return s.callerOf(c.Request().Context(), key)
}

// presentedKey is the key a request carries, "" if none.
func presentedKey(c echo.Context) (string, error) {
	key := c.Request().Header.Get("X-API-Key")
	if auth := c.Request().Header.Get("Authorization"); key == "" && auth != "" {
		scheme, token, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			return "", &refusal.Error{Class: refusal.Unauthenticated, Code: "unauthorized", Message: "Authorization must be 'Bearer <api key>'"}
		}
		key = token
	}
	return key, nil
}

// callerOf looks a key up: among the configured keys (by hash, in
// memory), else among the managed keys (through the cache: Redis only on
// a miss).
func (s *Server) callerOf(ctx context.Context, key string) (door.Caller, error) {
	hash := keys.Hash(key)
	var who door.Caller
	if k, ok := s.keys[hash]; ok {
		who = door.Caller{Tenant: k.Tenant, User: k.User, Tier: k.Tier, Scopes: k.Scopes, KeyID: "cfg_" + hash[:12]}
	} else {
		if s.keyCache == nil {
			return door.Caller{}, errUnknownKey
		}
		ctx, cancel := context.WithTimeout(ctx, s.cfg.Redis.RequestTimeout)
		defer cancel()
		k, err := s.keyCache.Verify(ctx, key)
		switch {
		case errors.Is(err, keys.ErrMalformed), errors.Is(err, keys.ErrUnknown), errors.Is(err, keys.ErrRevoked):
			return door.Caller{}, errUnknownKey
		case err != nil:
			s.logger.Warn("read API key", "err", err)
			return door.Caller{}, refusal.Unreachable("key store unavailable")
		}
		who = door.Caller{Tenant: k.Tenant, User: k.User, Tier: k.Tier, Scopes: k.Scopes, KeyID: k.ID}
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

// checkBans sets who's address, refuses the request if its address or
// key is banned, and counts a refused credential (authErr a 401) against
// them.
func (s *Server) checkBans(c echo.Context, who *door.Caller, authErr error) error {
	who.IP, who.Forwarded = c.RealIP(), s.proxies.relayed(c.Request())
	if err := s.door.CheckBans(c.Request().Context(), who); err != nil {
		return err
	}
	if refusedCredential(authErr) {
		s.door.RefusedCredential(c.Request().Context(), *who, c.Path())
	}
	return nil
}

// authenticateFor names the caller, as authenticate does, and charges the
// request to its tier's limit for route (door.LimitRoute).
func (s *Server) authenticateFor(c echo.Context, route string) (door.Caller, error) {
	who, err := s.authenticate(c)
	if err != nil {
		return who, err
	}
	standing, err := s.door.LimitRoute(c.Request().Context(), who, route)
	httpio.WriteStanding(c.Response().Header(), standing)
	return who, err
}

// callers is the server's authentication as the OpenAI routes take it.
type callers struct{ s *Server }

func (a callers) Chat(c echo.Context) (door.Caller, error) { return a.s.authenticateChat(c) }

func (a callers) For(c echo.Context, route string) (door.Caller, error) {
	return a.s.authenticateFor(c, route)
}
