package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/workflows"
)

// idempotencyHeader names the client's key for a POST it may retry.
const idempotencyHeader = "Idempotency-Key"

// replayedHeader marks a response that follows the request an earlier POST
// with the same Idempotency-Key started.
const replayedHeader = "Idempotent-Replayed"

// idemKey reads the request's Idempotency-Key, if it has one, and looks it
// up: a key that already names a request sent with the same body returns
// that request's id, to attach to; one sent with another body is 422. A
// request without the header gets nil and "". A request that was turned
// away (its stream ends rejected: nothing was done and its charge was
// given back) frees its key, so that the client's retry after Retry-After
// runs; any other outcome is the key's answer for its retention window.
func (s *Server) idemKey(ctx context.Context, c echo.Context, who caller, fingerprint string) (*idempotency.Key, string, error) {
	raw := c.Request().Header.Get(idempotencyHeader)
	if raw == "" || s.idem == nil {
		return nil, "", nil
	}
	k, err := s.idem.KeyFor(who.Tenant, who.User, raw, fingerprint)
	if err != nil {
		return nil, "", badRequest("bad_idempotency_key", "%s: %v", idempotencyHeader, err)
	}
	claim, ok, err := s.idem.Lookup(ctx, k)
	switch {
	case err != nil:
		s.logger.Warn("look up idempotency key", "err", err)
		return nil, "", unavailable("idempotency keys unavailable; please retry")
	case !ok:
		return &k, "", nil
	case !claim.Same:
		return nil, "", errKeyReused()
	}
	if last, ok, err := s.events.Last(ctx, claim.RequestID); err == nil && ok && last.Type == events.TypeRejected {
		s.releaseKey(ctx, &k, claim.RequestID)
		return &k, "", nil
	}
	return &k, claim.RequestID, nil
}

func errKeyReused() *apiError {
	return &apiError{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused",
		Message: "This Idempotency-Key was used for a request with a different body. Use a new key for a new request."}
}

// claimKey makes d's request the one k names, after its accepted event was
// written (so whoever attaches finds its stream). When another request won
// the key meanwhile, it returns that request's id: this one was never
// started and must be dropped for it.
func (s *Server) claimKey(ctx context.Context, k *idempotency.Key, d door) (string, error) {
	if k == nil {
		return "", nil
	}
	claim, won, err := s.idem.Claim(ctx, *k, d.id)
	switch {
	case err != nil:
		s.logger.Warn("claim idempotency key", "requestID", d.id, "err", err)
		return "", unavailable("idempotency keys unavailable; please retry")
	case won:
		return "", nil
	case !claim.Same:
		return "", errKeyReused()
	}
	return claim.RequestID, nil
}

// releaseKey gives a key back when its request could not be started, so
// that the client's retry starts one.
func (s *Server) releaseKey(ctx context.Context, k *idempotency.Key, id string) {
	if k == nil {
		return
	}
	if err := s.idem.Release(context.WithoutCancel(ctx), *k, id); err != nil {
		s.logger.Warn("release idempotency key", "requestID", id, "err", err)
	}
}

// fingerprintOf is what a retry's body is compared by: the route and the
// request as decoded and normalised (so that whitespace or key order does
// not make a retry "different").
func fingerprintOf(route string, parts ...any) string {
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
// request (nil without the header), or, when the key names a request
// whose events live, that request's id and a subscription that follows
// it.
func (s *Server) replay(ctx context.Context, c echo.Context, who caller, fingerprint string) (*idempotency.Key, string, *events.Subscription, error) {
	key, prior, err := s.idemKey(ctx, c, who, fingerprint)
	if err != nil || prior == "" {
		return key, "", nil, err
	}
	sub, err := s.attach(ctx, c, prior)
	if !errors.Is(err, errStreamGone) {
		return key, prior, sub, err
	}
	// Its events expired (or Redis lost them): the key names nothing.
	s.releaseKey(ctx, key, prior)
	return key, "", nil, nil
}

// errStreamGone: the request a key names has no events any more.
var errStreamGone = errors.New("the request's events are gone")

// attach follows the request an earlier POST with the same key started,
// from its first event (or after Last-Event-ID), as a resume does: nothing
// is charged and nothing starts. The workflow hears that a reader is back,
// in case the first client left.
func (s *Server) attach(ctx context.Context, c echo.Context, id string) (*events.Subscription, error) {
	after := c.Request().Header.Get("Last-Event-ID")
	if after == "" || !events.ValidID(after) {
		after = "0"
	}
	exists, err := s.events.Exists(ctx, id)
	switch {
	case err != nil:
		return nil, unavailable("event store unavailable")
	case !exists:
		return nil, errStreamGone
	}
	sub, err := s.hub.Subscribe(ctx, id, after)
	if err != nil {
		return nil, unavailable("event stream unavailable")
	}
	err = s.temporal.SignalWorkflow(context.WithoutCancel(ctx), workflows.ChatWorkflowID(id), "", workflows.SignalAttach, workflows.AttachSignal{})
	if err != nil && !isNotFound(err) {
		s.logger.Warn("signal attach", "requestID", id, "err", err)
	}
	c.Response().Header().Set(replayedHeader, "true")
	return sub, nil
}
