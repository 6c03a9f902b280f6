package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

type createKeyRequest struct {
	Tenant string   `json:"tenant"`
	User   string   `json:"user"`
	Tier   string   `json:"tier"`
	Scopes []string `json:"scopes"`
}

// keyView is a key as the admin API shows it: masked, never its secret.
type keyView struct {
	keys.Key
	Masked string `json:"masked"`
}

// createdKey carries the plain key, the one time it is shown.
type createdKey struct {
	keyView
	Plain string `json:"key"`
}

var errNoManagedKeys = &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "managed keys are not enabled on this server"}

// postKey creates a managed key and returns it in plain text, once.
func (s *Server) postKey(c echo.Context) error {
	if s.keyCache == nil {
		return errNoManagedKeys
	}
	var req createKeyRequest
	if err := httpio.DecodeJSON(c, &req, s.cfg.API.MaxBodyBytes); err != nil {
		return err
	}
	scopes := keys.DefaultScopes
	if len(req.Scopes) > 0 {
		var err error
		if scopes, err = keys.ParseScopes(req.Scopes); err != nil {
			return refusal.BadRequest("bad_scopes", "scopes: %v", err)
		}
	}
	if _, ok := s.policy.Current().Limits.Tiers[req.Tier]; req.Tier != "" && !ok {
		return refusal.BadRequest("unknown_tier", "tier: no tier %q in limits.tiers", req.Tier)
	}
	spec := keys.Spec{Tenant: req.Tenant, User: req.User, Tier: req.Tier, Scopes: scopes}
	if err := spec.Check(); err != nil {
		return refusal.BadRequest("bad_key", "%s", strings.TrimPrefix(err.Error(), keys.ErrInvalid.Error()+": "))
	}
	plain, k, err := s.keyCache.Store().Create(c.Request().Context(), spec)
	if err != nil {
		s.logger.Warn("create API key", "tenant", req.Tenant, "err", err)
		return refusal.Unreachable("key store unavailable")
	}
	s.logger.Info("API key created", "key_id", k.ID, "tenant", k.Tenant, "user", k.User, "tier", k.Tier, "scopes", k.Scopes.String())
	return c.JSON(http.StatusCreated, createdKey{keyView: keyView{Key: k, Masked: k.Masked()}, Plain: plain})
}

// listKeys lists the managed keys, masked, with when each was last used;
// ?tenant= keeps one tenant's.
func (s *Server) listKeys(c echo.Context) error {
	if s.keyCache == nil {
		return errNoManagedKeys
	}
	list, err := s.keyCache.Store().List(c.Request().Context(), c.QueryParam("tenant"))
	if err != nil {
		s.logger.Warn("list API keys", "err", err)
		return refusal.Unreachable("key store unavailable")
	}
	out := make([]keyView, len(list))
	for i, k := range list {
		out[i] = keyView{Key: k, Masked: k.Masked()}
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": out})
}

// revokeKey revokes a managed key on every instance (within moments:
// see keys.Cache).
func (s *Server) revokeKey(c echo.Context) error {
	if s.keyCache == nil {
		return errNoManagedKeys
	}
	id := c.Param("id")
	if !keys.ValidID(id) {
		return refusal.BadRequest("bad_key_id", "a key id is the 12 characters after sk_ (as GET /v1/admin/keys shows it)")
	}
	found, err := s.keyCache.Store().Revoke(c.Request().Context(), id)
	if err != nil {
		s.logger.Warn("revoke API key", "key_id", id, "err", err)
		return refusal.Unreachable("key store unavailable")
	}
	if !found {
		return &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "no such key"}
	}
	s.keyCache.Forget(id)
	s.logger.Info("API key revoked", "key_id", id)
	return c.JSON(http.StatusOK, map[string]any{"id": id, "masked": keys.Mask(id), "revoked": true})
}

type banView struct {
	ban.Ban
	RemainingS int `json:"remaining_s"`
}

var errNoBans = &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "bans are off (limits.ban.enabled)"}

// listBans lists the bans in force on every instance.
func (s *Server) listBans(c echo.Context) error {
	if s.bans == nil {
		return errNoBans
	}
	list, err := s.bans.List(c.Request().Context())
	if err != nil {
		s.logger.Warn("list bans", "err", err)
		return refusal.Unreachable("ban store unavailable")
	}
	out := make([]banView, len(list))
	for i, b := range list {
		out[i] = banView{Ban: b, RemainingS: int((b.Remaining + time.Second - 1) / time.Second)}
	}
	return c.JSON(http.StatusOK, map[string]any{"bans": out})
}

// liftBan ends a ban at once, on every instance.
func (s *Server) liftBan(c echo.Context) error {
	if s.bans == nil {
		return errNoBans
	}
	sub, err := s.bans.ParseSubject(c.Param("kind"), c.Param("value"))
	if err != nil {
		return refusal.BadRequest("bad_ban", "%v", err)
	}
	lifted, err := s.bans.Lift(c.Request().Context(), sub)
	if err != nil {
		s.logger.Warn("lift ban", "kind", sub.Kind, "value", sub.Value, "err", err)
		return refusal.Unreachable("ban store unavailable")
	}
	if !lifted {
		return &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "no such ban in force"}
	}
	s.logger.Info("ban lifted", "kind", sub.Kind, "value", sub.Value)
	return c.JSON(http.StatusOK, map[string]any{"kind": sub.Kind, "value": sub.Value, "lifted": true})
}
