package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// DefaultTimeout bounds one post when Webhook.Timeout is zero.
const DefaultTimeout = 5 * time.Second

// Webhook posts alerts to one URL.
type Webhook struct {
	// URL receives each alert; "" is no webhook, and Send does nothing.
	URL string
	// Timeout bounds one post; zero is DefaultTimeout.
	Timeout time.Duration
	// HTTP sends the posts; nil is http.DefaultClient.
	HTTP *http.Client
}

// Send posts a as JSON. A webhook that cannot be reached or answers other
// than 2xx is an error, for the caller to retry.
func (w Webhook) Send(ctx context.Context, a Alert) error {
	if w.URL == "" {
		return nil
	}
	if a.At.IsZero() {
		a.At = time.Now().UTC()
	}
	raw, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("encode alert of pool %s: %w", a.Pool, err)
	}
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	req.Header.Set("Content-Type", "application/json")
	hc := w.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("post alert of pool %s to webhook: %w", a.Pool, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("post alert of pool %s to webhook: %s", a.Pool, resp.Status)
	}
	return nil
}
