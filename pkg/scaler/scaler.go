// Package scaler asks an LLM serving pool for more or fewer replicas.
//
// Three implementations share one interface: Simulator drives Sluice's own
// simulator (pkg/llmsim) through its admin endpoint, Webhook posts the wanted
// count to any URL (an autoscaler, a cloud function, a chat-ops bot), and
// Kubernetes sets the scale subresource of a Deployment through the API
// server, authenticated by the pod's service account.
//
// Scale takes an absolute count, never a delta, so a call that is retried
// (a Temporal activity after a timeout, say) cannot scale twice: asking for
// the count a pool already has is a successful no-op. Bounds (minimum,
// maximum, step, cooldown) belong to the caller, the healing workflow; a
// Scaler only refuses counts that can never be right, negative ones.
package scaler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Scaler reads and sets the replica count of one pool.
type Scaler interface {
	// Replicas reports the count asked for and the count that exists now.
	Replicas(ctx context.Context) (Count, error)
	// Scale asks for replicas replicas. Reason is a short human-readable
	// cause ("p99/p50 = 7.2 on pool short"); implementations send or log it.
	Scale(ctx context.Context, replicas int, reason string) error
}

// Count is a pool's replica count.
type Count struct {
	// Desired is the count last asked for: a Deployment's spec.replicas,
	// the simulator's active replicas.
	Desired int
	// Current is how many replicas exist now. It lags Desired while pods
	// start or while removed replicas drain.
	Current int
}

// Settled reports whether the pool has reached the count asked for, so
// that a caller can wait for one change to land before deciding another.
func (c Count) Settled() bool { return c.Current == c.Desired }

var (
	// ErrInvalid marks a count the scaler or the target refused (a
	// negative count, or one outside the target's limits).
	ErrInvalid = errors.New("replica count refused")
	// ErrNotFound marks a target that does not exist (HTTP 404): a wrong
	// URL, namespace or Deployment name.
	ErrNotFound = errors.New("scale target not found")
	// ErrForbidden marks missing or insufficient credentials (HTTP 401 or
	// 403), such as a service account without RBAC on deployments/scale.
	ErrForbidden = errors.New("not allowed to scale")
	// ErrUnknown is returned by Replicas when the target cannot report its
	// count (a webhook without a status URL).
	ErrUnknown = errors.New("replica count unknown")
)

// Permanent reports whether retrying err is pointless until a person fixes
// configuration or RBAC; callers use it to mark an activity error
// non-retryable. Network errors, timeouts and 5xx answers are not permanent.
func Permanent(err error) bool {
	return errors.Is(err, ErrInvalid) || errors.Is(err, ErrNotFound) ||
		errors.Is(err, ErrForbidden) || errors.Is(err, ErrUnknown)
}

// StatusError is a non-2xx answer from a scale target.
type StatusError struct {
	// Op is what was being done, such as "PATCH https://.../scale".
	Op   string
	Code int
	// Message is the target's explanation: a Kubernetes Status message,
	// an API error message, or the start of the body.
	Message string
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("%s: %d %s", e.Op, e.Code, http.StatusText(e.Code))
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Unwrap maps the status to the package's errors, so that errors.Is(err,
// ErrNotFound) works whatever the target.
func (e *StatusError) Unwrap() error {
	switch e.Code {
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrForbidden
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return ErrInvalid
	}
	return nil
}

func checkReplicas(n int) error {
	if n < 0 {
		return fmt.Errorf("%w: replicas must be >= 0, got %d", ErrInvalid, n)
	}
	return nil
}

// DefaultTimeout bounds one call to a scale target when the options leave
// Timeout zero.
const DefaultTimeout = 10 * time.Second

// maxErrorBody bounds how much of an error body is read and quoted.
const maxErrorBody = 4 << 10

// endpoint is what the HTTP scalers share: a client, a per-call timeout,
// and the mapping of answers to errors.
type endpoint struct {
	client  *http.Client
	timeout time.Duration
}

func newEndpoint(client *http.Client, timeout time.Duration) endpoint {
	if client == nil {
		client = &http.Client{}
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return endpoint{client: client, timeout: timeout}
}

// call sends one request and decodes a 2xx JSON answer into out (if not
// nil). Header values are set as given; body, if not nil, is sent as is.
func (e endpoint) call(ctx context.Context, method, url string, header http.Header, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	op := method + " " + url
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return fmt.Errorf("build %s: %w", op, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return &StatusError{Op: op, Code: resp.StatusCode, Message: errorMessage(raw)}
	}
	if out == nil {
		// Drain so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s: decode answer: %w", op, err)
	}
	return nil
}

// errorMessage extracts the explanation from an error body: Kubernetes'
// Status {"message"}, OpenAI-style {"error":{"message"}} as llmsim writes
// it, or else the trimmed text.
func errorMessage(raw []byte) string {
	var body struct {
		Message string `json:"message"`
		Error   *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil {
		if body.Message != "" {
			return body.Message
		}
		if body.Error != nil && body.Error.Message != "" {
			return body.Error.Message
		}
	}
	return strings.TrimSpace(string(raw))
}
