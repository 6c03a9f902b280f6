package api

import (
	"crypto/subtle"
	"net/http"
	"sort"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// requireAdmin guards /v1/admin/* with auth.admin_key (or its hash) or
// any key holding the admin scope; with neither configured nor managed
// keys the routes do not exist. Admin calls count against the bans like
// any other, so the admin key cannot be guessed at leisure.
func (s *Server) requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !s.adminEnabled() {
			return &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "admin API disabled (set auth.admin_key or give a key the admin scope)"}
		}
		keyID, authErr := s.adminCaller(c)
		if err := s.checkBans(c, &door.Caller{KeyID: keyID}, authErr); err != nil {
			return err
		}
		if authErr != nil {
			return authErr
		}
		return next(c)
	}
}

func (s *Server) adminEnabled() bool {
	if s.cfg.Auth.AdminKey != "" || s.cfg.Auth.AdminKeySHA256 != "" || s.keyCache != nil {
		return true
	}
	for _, k := range s.keys {
		if k.Scopes.Has(keys.ScopeAdmin) {
			return true
		}
	}
	return false
}

// adminCaller checks the request's credential for the admin scope and
// returns the key id bans count it under ("" for the admin key).
func (s *Server) adminCaller(c echo.Context) (string, error) {
	token, err := presentedKey(c)
	if err != nil {
		return "", err
	}
	if token == "" {
		return "", &refusal.Error{Class: refusal.Unauthenticated, Code: "unauthorized", Message: "admin key required (Authorization: Bearer <auth.admin_key or a key with the admin scope>)"}
	}
	want := s.cfg.Auth.AdminKeySHA256
	if s.cfg.Auth.AdminKey != "" {
		want = keys.Hash(s.cfg.Auth.AdminKey)
	}
	// Hashes are compared, not keys: equal lengths whatever was sent.
	if want != "" && subtle.ConstantTimeCompare([]byte(keys.Hash(token)), []byte(strings.ToLower(want))) == 1 {
		return "", nil
	}
	who, err := s.callerOf(c.Request().Context(), token)
	if err != nil {
		return "", err
	}
	if !who.Scopes.Has(keys.ScopeAdmin) {
		return who.KeyID, &refusal.Error{Class: refusal.Forbidden, Code: "forbidden", Message: "this key lacks the admin scope"}
	}
	return who.KeyID, nil
}

// getLimits returns the live traffic policy: tiers, pool concurrency and,
// while the healer throttles long requests, their long_cost_factor.
func (s *Server) getLimits(c echo.Context) error {
	return c.JSON(http.StatusOK, s.policy.Current())
}

// putLimits replaces the live traffic policy for every instance.
// policyBodyLimit bounds a policy document sent to PUT /v1/admin/limits.
const policyBodyLimit = 1 << 20

func (s *Server) putLimits(c echo.Context) error {
	var p policy.Policy
	// A policy is the operator's document, not a client's request: it is
	// not bounded by api.max_body_bytes, which is sized for chats.
	if err := httpio.DecodeJSON(c, &p, policyBodyLimit); err != nil {
		return err
	}
	out, err := s.policy.Put(c.Request().Context(), p)
	if err != nil {
		if strings.HasPrefix(err.Error(), "invalid") {
			return refusal.BadRequest("invalid_policy", "%v", err)
		}
		return refusal.Unreachable("could not publish the policy")
	}
	s.logger.Info("traffic policy changed", "version", out.Version)
	return c.JSON(http.StatusOK, out)
}

type poolView struct {
	Pool         string         `json:"pool"`
	Limit        int            `json:"limit"`
	InUse        int            `json:"in_use"`
	Waiting      int            `json:"waiting"`
	OldestWaitMs int64          `json:"oldest_wait_ms"`
	MeanHoldMs   int64          `json:"mean_hold_ms"`
	ByTenant     map[string]int `json:"by_tenant"`
	ByTier       map[string]int `json:"by_tier"`
	// Parked waiters wait for their tenant's own permits (its tier's
	// max_concurrent), not for a free one; HeldByTenant is each tenant's.
	Parked       int            `json:"parked"`
	HeldByTenant map[string]int `json:"held_by_tenant"`
}

// getQueue shows each pool's permits and queue, by tenant and by tier.
func (s *Server) getQueue(c echo.Context) error {
	ctx := c.Request().Context()
	live := s.policy.Current()
	tierOf := map[string]string{"anonymous": live.Limits.DefaultTier}
	for _, k := range s.cfg.Auth.APIKeys {
		t := k.Tier
		if t == "" {
			t = live.Limits.DefaultTier
		}
		tierOf[k.Tenant] = t
	}
	pools := s.gate.Pools()
	sort.Strings(pools)
	out := make([]poolView, 0, len(pools))
	for _, pool := range pools {
		st, err := s.gate.QueueStats(ctx, pool)
		if err != nil {
			return refusal.Unreachable("queue state unavailable")
		}
		v := poolView{Pool: pool, Limit: st.Limit, InUse: st.InUse, Waiting: st.Waiting,
			OldestWaitMs: st.OldestWait.Milliseconds(), MeanHoldMs: st.MeanHold.Milliseconds(),
			ByTenant: st.ByTenant, ByTier: map[string]int{}, Parked: st.Parked, HeldByTenant: st.HeldByTenant}
		for tenant, n := range st.ByTenant {
			t, ok := tierOf[tenant]
			if !ok {
				t = "unknown"
			}
			v.ByTier[t] += n
		}
		out = append(out, v)
	}
	return c.JSON(http.StatusOK, map[string]any{"pools": out})
}
