package api

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/sluice-dev/sluice/pkg/keys"
)

// caller is who sent a request, and what its key lets it do.
type caller struct {
	Tenant, User, Tier string
	Scopes             keys.Scopes
}

// authenticate names the caller from its API key (X-API-Key, or
// Authorization: Bearer), or as the anonymous tenant where allowed.
func (s *Server) authenticate(c echo.Context) (caller, error) {
	key := c.Request().Header.Get("X-API-Key")
	if auth := c.Request().Header.Get("Authorization"); key == "" && auth != "" {
		scheme, token, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			return caller{}, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "Authorization must be 'Bearer <api key>'"}
		}
		key = token
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
	k, ok := s.keys[key]
	if !ok {
		return caller{}, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "unknown API key"}
	}
	// Until keys carry their own scopes, a configured key may chat and
	// ingest.
	who := caller{Tenant: k.Tenant, User: k.User, Tier: k.Tier, Scopes: keys.Scopes{keys.ScopeChat, keys.ScopeIngest}}
	if who.User == "" {
		who.User = k.Tenant
	}
	if who.Tier == "" {
		who.Tier = s.policy.Current().Limits.DefaultTier
	}
	return who, nil
}
