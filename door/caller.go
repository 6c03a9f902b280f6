package door

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/httperr"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
)

// Caller is who sent a request, and what its key lets it do.
type Caller struct {
	Tenant, User, Tier string
	Scopes             keys.Scopes
	// KeyID names the key in logs and bans: a managed key's id, cfg_ and
	// the start of a configured key's hash; never the key itself. Empty
	// for anonymous callers.
	KeyID string
	// IP is the client's address as the HTTP layer sees it; the door
	// hashes it before it names anything.
	IP string

	// storeSilent: the ban check waited redis.request_timeout for Redis
	// in vain (see CheckBans).
	storeSilent bool
}

// Needs refuses a caller whose key lacks scope; what says what the scope
// allows.
func (who Caller) Needs(scope keys.Scope, what string) error {
	if who.Scopes.Has(scope) {
		return nil
	}
	return &httperr.Error{Status: http.StatusForbidden, Code: "missing_scope",
		Message: fmt.Sprintf("this API key may not %s: it lacks the %s scope", what, scope)}
}

// SessionOwner is whom the caller's sessions belong to: its user within
// its tenant. Anonymous callers share one (they share a tenant, with no
// user to tell them apart).
func (who Caller) SessionOwner() session.Owner {
	return session.Owner{Tenant: who.Tenant, User: who.User}
}

// CheckBans counts a request against its caller's address and key (one
// Redis call) and refuses it if either is banned, with the ban's
// remaining time as Retry-After; path names the route in the log line of
// a new ban. A ban store that does not answer lets the request through
// (bans guard against floods, and the rate limits, which fail closed,
// still stand); when it used up redis.request_timeout, the caller is
// marked so that Admit refuses at once rather than wait as long again.
func (d *Door) CheckBans(ctx context.Context, who *Caller, path string) error {
	if d.bans == nil {
		return nil
	}
	subjects := []ban.Subject{d.bans.IP(who.IP)}
	if who.KeyID != "" {
		subjects = append(subjects, ban.Subject{Kind: ban.KindKey, Value: who.KeyID})
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Redis.RequestTimeout)
	defer cancel()
	v, err := d.bans.Hit(ctx, subjects...)
	if err != nil {
		d.logger.Warn("ban check failed; request let through", "err", err)
		who.storeSilent = errors.Is(ctx.Err(), context.DeadlineExceeded)
		return nil
	}
	if !v.Banned {
		return nil
	}
	d.metrics.Banned(string(v.Kind), v.New)
	if v.New {
		b := d.cfg.Limits.Ban
		d.logger.Warn("banned for flooding", "kind", v.Kind, "value", v.Value, "for", b.Duration,
			"threshold", b.Threshold, "window", b.Window, "path", path)
	}
	secs := request.RetryAfterSeconds(v.RetryAfter)
	what := "client address"
	if v.Kind == ban.KindKey {
		what = "API key"
	}
	return &httperr.Error{Status: http.StatusTooManyRequests, Code: "banned", RetryAfter: secs,
		Message: fmt.Sprintf("this %s sent too many requests and is banned; retry in %ds", what, secs)}
}
