package door

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/refusal"
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
	// Forwarded: the request came over a trusted proxy's connection, so
	// IP is what the proxy named (or the proxy's own), and never exempt
	// from bans as a connection's own address may be (limits.ban.exempt).
	Forwarded bool

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
	return &refusal.Error{Class: refusal.Forbidden, Code: "missing_scope",
		Message: fmt.Sprintf("this API key may not %s: it lacks the %s scope", what, scope)}
}

// SessionOwner is whom the caller's sessions belong to: its user within
// its tenant. Anonymous callers share one (they share a tenant, with no
// user to tell them apart).
func (who Caller) SessionOwner() session.Owner {
	return session.Owner{Tenant: who.Tenant, User: who.User}
}

// CheckBans refuses a request whose address or key is banned, with the
// ban's remaining time as Retry-After (one Redis round trip, counting
// nothing). A ban store that does not
// answer lets the request through (bans guard against abuse, and the rate
// limits, which fail closed, still stand); when it used up
// redis.request_timeout, the caller is marked so that Admit refuses at
// once rather than wait as long again.
func (d *Door) CheckBans(ctx context.Context, who *Caller) error {
	if d.bans == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Redis.RequestTimeout)
	defer cancel()
	v, err := d.bans.Check(ctx, d.banSubjects(*who)...)
	if err != nil {
		d.logger.Warn("ban check failed; request let through", "err", err)
		who.storeSilent = errors.Is(ctx.Err(), context.DeadlineExceeded)
		return nil
	}
	return d.banned(v)
}

// RefusedCredential counts a request refused for a bad or unknown
// credential against the bans of its address (and of the key it named,
// if any): guessing keys is abuse, however slowly it is done.
func (d *Door) RefusedCredential(ctx context.Context, who Caller, path string) {
	if d.bans != nil {
		d.strike(ctx, who, path, d.bans.Strike)
	}
}

// refusedWithRetry tells the bans that who was refused by a rate limit
// with retryAfter: a client that keeps coming back before then earns a
// strike each time (ban.Guard.Refused); one that waits as told, none.
func (d *Door) refusedWithRetry(ctx context.Context, who Caller, retryAfter time.Duration, path string) {
	if d.bans == nil {
		return
	}
	d.strike(ctx, who, path, func(ctx context.Context, subjects ...ban.Subject) (ban.Verdict, error) {
		return d.bans.Refused(ctx, retryAfter, subjects...)
	})
}

// strike counts one strike of who with count (a ban.Guard method), within
// redis.request_timeout and whether or not the request's client stays,
// and logs and counts a ban it imposed; the request itself is already
// refused for what it did.
func (d *Door) strike(ctx context.Context, who Caller, path string, count func(context.Context, ...ban.Subject) (ban.Verdict, error)) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.Redis.RequestTimeout)
	defer cancel()
	v, err := count(ctx, d.banSubjects(who)...)
	if err != nil {
		d.logger.Warn("count a strike for the bans", "err", err)
	}
	if !v.New {
		return
	}
	d.metrics.BanImposed(string(v.Kind))
	b := d.cfg.Limits.Ban
	d.logger.Warn("banned for abuse", "kind", v.Kind, "value", v.Value, "for", b.Duration,
		"threshold", b.Threshold, "window", b.Window, "path", path)
}

// banSubjects are what a ban can name of a caller: its address and its
// key.
func (d *Door) banSubjects(who Caller) []ban.Subject {
	ip := d.bans.IP(who.IP)
	if who.Forwarded {
		ip = d.bans.ForwardedIP(who.IP)
	}
	subjects := []ban.Subject{ip}
	if who.KeyID != "" {
		subjects = append(subjects, ban.Subject{Kind: ban.KindKey, Value: who.KeyID})
	}
	return subjects
}

// banned is the refusal of a caller v finds banned (nil if it bans
// nothing), counted.
func (d *Door) banned(v ban.Verdict) error {
	if !v.Banned {
		return nil
	}
	d.metrics.Banned(string(v.Kind))
	secs := request.RetryAfterSeconds(v.RetryAfter)
	what := "client address"
	if v.Kind == ban.KindKey {
		what = "API key"
	}
	return &refusal.Error{Class: refusal.Limited, Code: "banned", RetryAfter: secs,
		Message: fmt.Sprintf("this %s was banned for ignoring its Retry-After or for refused credentials; retry in %ds", what, secs)}
}
