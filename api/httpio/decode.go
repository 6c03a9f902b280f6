// Package httpio is what every HTTP surface of Sluice reads and writes the
// same way: JSON bodies (size-limited, UTF-8 intact, no unknown fields)
// and Server-Sent Event streams whose writes are bounded in time.
package httpio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// DecodeJSON reads a JSON object of at most limit bytes with no unknown
// fields and nothing after it.
func DecodeJSON(c echo.Context, dst any, limit int64) error {
	body, err := ReadJSONBody(c, limit)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return refusal.BadRequest("bad_json", "malformed JSON: %v", err)
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return refusal.BadRequest("bad_json", "unexpected data after the JSON object")
	}
	return nil
}

// ReadJSONBody reads a non-empty, size-limited body sent as JSON. The
// Content-Type is required, not assumed: a web page can post a form or
// text/plain to another origin without a CORS preflight, but not JSON.
func ReadJSONBody(c echo.Context, limit int64) ([]byte, error) {
	if err := checkJSONContentType(c.Request().Header.Get(echo.HeaderContentType)); err != nil {
		return nil, err
	}
	body, err := readBody(c, limit)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, &refusal.Error{Class: refusal.TooLarge, Code: "body_too_large",
				Message: fmt.Sprintf("request body exceeds %d bytes", limit)}
		case errors.Is(err, os.ErrDeadlineExceeded):
			// api.body_read_timeout: the server closes the connection.
			return nil, &refusal.Error{Class: refusal.Timeout, Code: "body_timeout",
				Message: "the request body did not arrive in time"}
		}
		return nil, refusal.BadRequest("bad_body", "read request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, refusal.BadRequest("bad_json", "request body must be a JSON object")
	}
	if err := checkDepth(body); err != nil {
		return nil, err
	}
	if !textIntact(body) {
		return nil, invalidUTF8(body)
	}
	return body, nil
}

// checkJSONContentType accepts application/json, with a charset
// parameter only if it is UTF-8, the only encoding JSON may travel in.
func checkJSONContentType(ct string) error {
	refuse := &refusal.Error{Class: refusal.UnsupportedMedia, Code: "unsupported_media_type",
		Message: "Content-Type must be application/json"}
	if ct == "" {
		return refuse
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != echo.MIMEApplicationJSON {
		return refuse
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
		refuse.Message = "Content-Type must be application/json in UTF-8, got charset " + cs
		return refuse
	}
	return nil
}

// readBody reads a body of at most limit bytes, as io.ReadAll does but
// into a buffer sized by its Content-Length when it declares one within
// the limit, rather than one grown by doubling (which allocates about
// twice the body).
func readBody(c echo.Context, limit int64) ([]byte, error) {
	r := http.MaxBytesReader(c.Response(), c.Request().Body, limit)
	size := 512
	if n := c.Request().ContentLength; n > 0 && n <= limit {
		size = int(n) + 1 // one more, to read the end without growing
	}
	b := make([]byte, 0, size)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
