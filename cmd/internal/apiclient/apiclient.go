// Package apiclient is how Sluice's command-line tools (sluice keys,
// sluice usage) talk to a running API: where it is, and one call that
// sends a key, reads the answer and turns an error answer into its code
// and message.
package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultURL is the API's address when neither -url nor $SLUICE_URL
// names one: make run's.
const DefaultURL = "http://127.0.0.1:8080"

// BaseURL is the default of a tool's -url flag: $SLUICE_URL, else
// DefaultURL.
func BaseURL(getenv func(string) string) string {
	if u := getenv("SLUICE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// maxAnswer bounds an answer read into memory when the Client sets no
// Limit (a year of usage as CSV is far below it).
const maxAnswer = 32 << 20

// Client calls the API at Base with Key as its bearer credential.
type Client struct {
	Base string
	Key  string
	HTTP *http.Client
	// Limit bounds an answer's bytes read (0: 32 MiB).
	Limit int64
}

// New is a Client for base with key and a 30-second timeout a call.
func New(base, key string) Client {
	return Client{Base: strings.TrimRight(base, "/"), Key: key, HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// Do sends body (if not nil) as JSON to path and returns the answer's
// body; an error answer is returned as an *Error.
func (c Client) Do(ctx context.Context, method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return nil, err
	}
	// No key is an anonymous call, which a server with anonymous access
	// takes and any other refuses with 401.
	if c.Key != "" {
		req.Header.Set("Authorization", "Bearer "+c.Key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	limit := c.Limit
	if limit <= 0 {
		limit = maxAnswer
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		return nil, errorAnswer(method, path, resp, raw)
	}
	return raw, nil
}

// Call is Do that decodes the answer into dst (if not nil).
func (c Client) Call(ctx context.Context, method, path string, body, dst any) error {
	raw, err := c.Do(ctx, method, path, body)
	if err != nil || dst == nil {
		return err
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// Error is an error answer: its status, the code and message of its
// {"error": {...}} body when it has one, and how long its Retry-After
// asks to wait (0 without one).
type Error struct {
	Method, Path string
	Status       int
	StatusText   string
	Code         string
	Message      string
	RetryAfter   time.Duration
}

func (e *Error) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("%s %s: %s", e.Method, e.Path, e.StatusText)
}

// errorAnswer reads an error answer into an *Error.
func errorAnswer(method, path string, resp *http.Response, raw []byte) *Error {
	e := &Error{Method: method, Path: path, Status: resp.StatusCode, StatusText: resp.Status}
	var body struct {
		Error struct{ Code, Message string }
	}
	if json.Unmarshal(raw, &body) == nil {
		e.Code, e.Message = body.Error.Code, body.Error.Message
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}
