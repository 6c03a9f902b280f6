package api

import (
	"crypto/subtle"
	"net/http"
	"sort"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/policy"
)

// requireAdmin guards /v1/admin/* with auth.admin_key; without one
// configured the routes do not exist.
func (s *Server) requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.cfg.Auth.AdminKey == "" {
			return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "admin API disabled (auth.admin_key is not set)"}
		}
		token := strings.TrimPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
		if subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Auth.AdminKey)) != 1 {
			return &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "admin key required (Authorization: Bearer <auth.admin_key>)"}
		}
		return next(c)
	}
}

// getLimits returns the live traffic policy: tiers, pool concurrency and,
// while the healer throttles long requests, their long_cost_factor.
func (s *Server) getLimits(c echo.Context) error {
	return c.JSON(http.StatusOK, s.policy.Current())
}

// putLimits replaces the live traffic policy for every instance.
func (s *Server) putLimits(c echo.Context) error {
	var p policy.Policy
	if err := s.decodeJSON(c, &p); err != nil {
		return err
	}
	out, err := s.policy.Put(c.Request().Context(), p)
	if err != nil {
		if strings.HasPrefix(err.Error(), "invalid") {
			return badRequest("invalid_policy", "%v", err)
		}
		return unavailable("could not publish the policy")
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
			return unavailable("queue state unavailable")
		}
		v := poolView{Pool: pool, Limit: st.Limit, InUse: st.InUse, Waiting: st.Waiting,
			OldestWaitMs: st.OldestWait.Milliseconds(), MeanHoldMs: st.MeanHold.Milliseconds(),
			ByTenant: st.ByTenant, ByTier: map[string]int{}}
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
