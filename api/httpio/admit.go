package httpio

import (
	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
)

// Admit takes a validated chat request through the door: it copies what
// the door needs to resolve the POST's Idempotency-Key into req (the key,
// where a replay resumes, and fingerprint, what a retry's body is
// compared by), and tells the client where it stands (WriteStanding)
// whatever the outcome.
func Admit(c echo.Context, d *door.Door, who door.Caller, req *door.Request, fingerprint string) (door.Admission, error) {
	h := c.Request().Header
	req.IdempotencyKey, req.LastEventID, req.Fingerprint = h.Get(IdempotencyHeader), h.Get("Last-Event-ID"), fingerprint
	adm, err := d.Admit(c.Request().Context(), who, req)
	WriteStanding(c.Response().Header(), adm.Standing)
	return adm, err
}
