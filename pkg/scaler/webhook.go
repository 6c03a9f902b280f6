package scaler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// WebhookOptions configures a Webhook.
type WebhookOptions struct {
	// URL receives POST {"pool","replicas","reason"} as JSON. Any 2xx
	// answer is success; the body is ignored.
	URL string
	// StatusURL, if set, answers GET with {"replicas": N} and optionally
	// {"current_replicas": M} (M defaults to N). Without it, Replicas
	// returns ErrUnknown.
	StatusURL string
	// Pool names the pool in every request body.
	Pool string
	// Token, if set, is sent as "Authorization: Bearer <Token>".
	Token string
	// Client sends the requests; nil means a plain http.Client.
	Client *http.Client
	// Timeout bounds each call; zero means DefaultTimeout.
	Timeout time.Duration
	// Logger records scale requests; nil discards.
	Logger *slog.Logger
}

// Webhook asks an external system to scale by posting the wanted count.
//
// The receiver must treat "replicas" as the count to have, not as a change,
// so that a repeated POST is harmless. A Webhook keeps no memory of what it
// sent: without a StatusURL, Replicas returns ErrUnknown rather than the
// last count this process posted, because that value would be wrong after
// a restart or after anyone else scaled the pool. The healing workflow
// records what it asked for in its own durable state.
type Webhook struct {
	url, status string
	pool, token string
	ep          endpoint
	log         *slog.Logger
}

var _ Scaler = (*Webhook)(nil)

// NewWebhook checks the options.
func NewWebhook(o WebhookOptions) (*Webhook, error) {
	var errs []error
	u, err := parseBaseURL(o.URL)
	if err != nil {
		errs = append(errs, fmt.Errorf("URL: %w", err))
	}
	var status string
	if o.StatusURL != "" {
		if status, err = parseBaseURL(o.StatusURL); err != nil {
			errs = append(errs, fmt.Errorf("StatusURL: %w", err))
		}
	}
	if o.Pool == "" {
		errs = append(errs, errors.New("pool must not be empty"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("webhook scaler: %w", errors.Join(errs...))
	}
	return &Webhook{
		url: u, status: status, pool: o.Pool, token: o.Token,
		ep: newEndpoint(o.Client, o.Timeout), log: orDiscard(o.Logger),
	}, nil
}

// WebhookRequest is the body POSTed to WebhookOptions.URL.
type WebhookRequest struct {
	Pool     string `json:"pool"`
	Replicas int    `json:"replicas"`
	Reason   string `json:"reason"`
}

// WebhookStatus is the answer expected from WebhookOptions.StatusURL.
type WebhookStatus struct {
	Replicas        *int `json:"replicas"`
	CurrentReplicas *int `json:"current_replicas,omitempty"`
}

func (w *Webhook) header() http.Header {
	h := jsonAccept()
	if w.token != "" {
		h.Set("Authorization", "Bearer "+w.token)
	}
	return h
}

// Replicas GETs the StatusURL, or returns ErrUnknown without one.
func (w *Webhook) Replicas(ctx context.Context) (Count, error) {
	if w.status == "" {
		return Count{}, fmt.Errorf("read %s pool replicas: %w: the webhook has no status URL", w.pool, ErrUnknown)
	}
	var st WebhookStatus
	if err := w.ep.call(ctx, http.MethodGet, w.status, w.header(), nil, &st); err != nil {
		return Count{}, fmt.Errorf("read %s pool replicas: %w", w.pool, err)
	}
	if st.Replicas == nil {
		return Count{}, fmt.Errorf("read %s pool replicas: GET %s: answer has no replicas field", w.pool, w.status)
	}
	c := Count{Desired: *st.Replicas, Current: *st.Replicas}
	if st.CurrentReplicas != nil {
		c.Current = *st.CurrentReplicas
	}
	return c, nil
}

// Scale POSTs the wanted count.
func (w *Webhook) Scale(ctx context.Context, replicas int, reason string) error {
	if err := checkReplicas(replicas); err != nil {
		return fmt.Errorf("scale %s pool: %w", w.pool, err)
	}
	body, err := json.Marshal(WebhookRequest{Pool: w.pool, Replicas: replicas, Reason: reason})
	if err != nil {
		return fmt.Errorf("scale %s pool: encode request: %w", w.pool, err)
	}
	h := w.header()
	h.Set("Content-Type", "application/json")
	if err := w.ep.call(ctx, http.MethodPost, w.url, h, body, nil); err != nil {
		return fmt.Errorf("scale %s pool to %d: %w", w.pool, replicas, err)
	}
	w.log.InfoContext(ctx, "asked webhook to scale", "pool", w.pool, "replicas", replicas, "reason", reason)
	return nil
}
