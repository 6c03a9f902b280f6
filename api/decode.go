package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/labstack/echo/v4"
)

// decodeJSON reads a size-limited JSON object with no unknown fields and
// nothing after it.
func (s *Server) decodeJSON(c echo.Context, dst any) error {
	return s.decodeJSONLimit(c, dst, s.cfg.API.MaxBodyBytes)
}

// decodeJSONLimit is decodeJSON with a body limit of its own.
func (s *Server) decodeJSONLimit(c echo.Context, dst any, limit int64) error {
	body, err := readJSONBody(c, limit)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return badRequest("bad_json", "malformed JSON: %v", err)
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return badRequest("bad_json", "unexpected data after the JSON object")
	}
	return nil
}

// readJSONBody reads a non-empty, size-limited body sent as JSON.
func readJSONBody(c echo.Context, limit int64) ([]byte, error) {
	if ct := c.Request().Header.Get(echo.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != echo.MIMEApplicationJSON {
			return nil, &apiError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type", Message: "Content-Type must be application/json"}
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), c.Request().Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
				Message: fmt.Sprintf("request body exceeds %d bytes", limit)}
		}
		return nil, badRequest("bad_body", "read request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest("bad_json", "request body must be a JSON object")
	}
	return body, nil
}
