package door

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// idemKey reads the request's Idempotency-Key, if it has one, and looks it
// up: a key that already names a request sent with the same body returns
// that request's id, to attach to; one sent with another body is 422. A
// request without the header gets nil and "". A request that was turned
// away (its stream ends rejected: nothing was done and its charge was
// given back) frees its key, so that the client's retry after Retry-After
// runs; any other outcome is the key's answer for its retention window.
func (d *Door) idemKey(ctx context.Context, who Caller, req *Request) (*idempotency.Key, string, error) {
	if req.IdempotencyKey == "" || d.idem == nil {
		return nil, "", nil
	}
	k, err := d.idem.KeyFor(who.Tenant, who.User, req.IdempotencyKey, req.Fingerprint)
	if err != nil {
		return nil, "", refusal.BadRequest("bad_idempotency_key", "Idempotency-Key: %v", err)
	}
	claim, ok, err := d.idem.Lookup(ctx, k)
	switch {
	case err != nil:
		d.logger.Warn("look up idempotency key", "err", err)
		return nil, "", refusal.Unreachable("idempotency keys unavailable; please retry")
	case !ok:
		return &k, "", nil
	case !claim.Same:
		return nil, "", errKeyReused()
	}
	if end, ok, err := d.events.End(ctx, claim.RequestID); err == nil && ok && end.Type == events.TypeRejected {
		d.releaseKey(ctx, &k, claim.RequestID)
		return &k, "", nil
	}
	return &k, claim.RequestID, nil
}

func errKeyReused() *refusal.Error {
	return &refusal.Error{Class: refusal.Unprocessable, Code: "idempotency_key_reused",
		Message: "This Idempotency-Key was used for a request with a different body. Use a new key for a new request."}
}

// claimKey makes d's request the one k names, after its accepted event was
// written (so whoever attaches finds its stream). When another request won
// the key meanwhile, it returns that request's id: this one was never
// started and must be dropped for it.
func (d *Door) claimKey(ctx context.Context, k *idempotency.Key, a arrival) (string, error) {
	if k == nil {
		return "", nil
	}
	claim, won, err := d.idem.Claim(ctx, *k, a.id)
	switch {
	case err != nil:
		d.logger.Warn("claim idempotency key", "requestID", a.id, "err", err)
		return "", refusal.Unreachable("idempotency keys unavailable; please retry")
	case won:
		return "", nil
	case !claim.Same:
		return "", errKeyReused()
	}
	return claim.RequestID, nil
}

// releaseKey gives a key back when its request could not be started, so
// that the client's retry starts one.
func (d *Door) releaseKey(ctx context.Context, k *idempotency.Key, id string) {
	if k == nil {
		return
	}
	if err := d.idem.Release(context.WithoutCancel(ctx), *k, id); err != nil {
		d.logger.Warn("release idempotency key", "requestID", id, "err", err)
	}
}

// Fingerprint is what a retry's body is compared by: the route and the
// request as decoded and normalised (so that whitespace or key order does
// not make a retry "different").
func Fingerprint(route string, parts ...any) string {
	raw := [][]byte{[]byte(route)}
	for _, p := range parts {
		b, err := json.Marshal(p)
		if err != nil {
			// Only decoded requests come here, and they encode.
			b = []byte(fmt.Sprintf("%#v", p))
		}
		raw = append(raw, b)
	}
	return idempotency.Fingerprint(raw...)
}

// replay resolves a POST's Idempotency-Key: the key to claim for a new
// request (nil without one), or, when the key names a request whose
// events live, that request's id and a subscription that follows it
// (st notes the replay).
func (d *Door) replay(ctx context.Context, st *Standing, who Caller, req *Request) (*idempotency.Key, string, *events.Subscription, error) {
	key, prior, err := d.idemKey(ctx, who, req)
	if err != nil || prior == "" {
		return key, "", nil, err
	}
	sub, err := d.attach(ctx, st, who, prior, req.LastEventID)
	if !errors.Is(err, follow.ErrStreamGone) {
		return key, prior, sub, err
	}
	// Its events expired (or Redis lost them): the key names nothing.
	d.releaseKey(ctx, key, prior)
	return key, "", nil, nil
}

// attach follows the request an earlier POST with the same key started,
// from its first event (or after Last-Event-ID), as a resume does:
// nothing starts and the chat's limits are not charged, but the replay is
// charged to the tier's resumes limit (LimitRoute), as a resume is, so
// that a client repeating one POST cannot subscribe and signal without
// bound. A replay refused by that limit attaches to nothing.
func (d *Door) attach(ctx context.Context, st *Standing, who Caller, id, after string) (*events.Subscription, error) {
	rates, err := d.LimitRoute(ctx, who, policy.RouteResumes)
	st.Tokens, st.Requests = rates.Tokens, rates.Requests
	if err != nil {
		return nil, err
	}
	sub, err := d.attacher.Attach(ctx, id, after)
	if err == nil {
		st.Replayed = true
	}
	return sub, err
}
