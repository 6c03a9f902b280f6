package scaler_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/scaler"
)

// hook records what it receives and answers with status and body.
type hook struct {
	status int
	body   string
	delay  time.Duration

	mu       sync.Mutex
	requests []string // "METHOD path auth content-type body"
}

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.requests = append(h.requests, strings.Join([]string{r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(b)}, "|"))
	h.mu.Unlock()
	if h.delay > 0 {
		select {
		case <-time.After(h.delay):
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(h.status)
	_, _ = w.Write([]byte(h.body))
}

func (h *hook) log() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.requests...)
}

func TestWebhook(t *testing.T) {
	tests := []struct {
		name      string
		hook      *hook
		token     string
		status    bool // configure StatusURL
		timeout   time.Duration
		run       func(ctx context.Context, w *scaler.Webhook) error
		wantErr   error
		wantMsg   string
		permanent bool
		requests  []string
	}{
		{
			name: "scale with token", hook: &hook{status: http.StatusAccepted}, token: "s3cret",
			run:      func(ctx context.Context, w *scaler.Webhook) error { return w.Scale(ctx, 6, "p99/p50 = 7.2") },
			requests: []string{`POST|/scale|Bearer s3cret|application/json|{"pool":"long","replicas":6,"reason":"p99/p50 = 7.2"}`},
		},
		{
			name: "scale without token, same count twice", hook: &hook{status: http.StatusNoContent},
			run: func(ctx context.Context, w *scaler.Webhook) error {
				if err := w.Scale(ctx, 2, "again"); err != nil {
					return err
				}
				return w.Scale(ctx, 2, "again")
			},
			requests: []string{
				`POST|/scale||application/json|{"pool":"long","replicas":2,"reason":"again"}`,
				`POST|/scale||application/json|{"pool":"long","replicas":2,"reason":"again"}`,
			},
		},
		{
			name: "negative", hook: &hook{status: http.StatusOK},
			run:     func(ctx context.Context, w *scaler.Webhook) error { return w.Scale(ctx, -1, "") },
			wantErr: scaler.ErrInvalid, wantMsg: "scale long pool: replica count refused: replicas must be >= 0, got -1", permanent: true,
		},
		{
			name: "refused", hook: &hook{status: http.StatusForbidden, body: "pool long is frozen\n"},
			run:     func(ctx context.Context, w *scaler.Webhook) error { return w.Scale(ctx, 3, "") },
			wantErr: scaler.ErrForbidden, wantMsg: "/scale: 403 Forbidden: pool long is frozen", permanent: true,
			requests: []string{`POST|/scale||application/json|{"pool":"long","replicas":3,"reason":""}`},
		},
		{
			name: "server error is retryable", hook: &hook{status: http.StatusBadGateway},
			run:      func(ctx context.Context, w *scaler.Webhook) error { return w.Scale(ctx, 3, "") },
			wantMsg:  "scale long pool to 3: POST http://127.0.0.1:",
			requests: []string{`POST|/scale||application/json|{"pool":"long","replicas":3,"reason":""}`},
		},
		{
			name: "timeout", hook: &hook{status: http.StatusOK, delay: 5 * time.Second}, timeout: 50 * time.Millisecond,
			run:      func(ctx context.Context, w *scaler.Webhook) error { return w.Scale(ctx, 3, "") },
			wantMsg:  "context deadline exceeded",
			requests: []string{`POST|/scale||application/json|{"pool":"long","replicas":3,"reason":""}`},
		},
		{
			name: "no status URL", hook: &hook{status: http.StatusOK},
			run:     func(ctx context.Context, w *scaler.Webhook) error { _, err := w.Replicas(ctx); return err },
			wantErr: scaler.ErrUnknown, wantMsg: "read long pool replicas: replica count unknown: the webhook has no status URL", permanent: true,
		},
		{
			name: "status", hook: &hook{status: http.StatusOK, body: `{"replicas":4}`}, status: true, token: "t",
			run: func(ctx context.Context, w *scaler.Webhook) error {
				c, err := w.Replicas(ctx)
				if err == nil && c != (scaler.Count{Desired: 4, Current: 4}) {
					return fmt.Errorf("count %+v", c)
				}
				return err
			},
			requests: []string{"GET|/status|Bearer t||"},
		},
		{
			name: "status with current", hook: &hook{status: http.StatusOK, body: `{"replicas":4,"current_replicas":1}`}, status: true,
			run: func(ctx context.Context, w *scaler.Webhook) error {
				c, err := w.Replicas(ctx)
				if err == nil && c != (scaler.Count{Desired: 4, Current: 1}) {
					return fmt.Errorf("count %+v", c)
				}
				return err
			},
			requests: []string{"GET|/status|||"},
		},
		{
			name: "status without replicas", hook: &hook{status: http.StatusOK, body: `{"current_replicas":1}`}, status: true,
			run:      func(ctx context.Context, w *scaler.Webhook) error { _, err := w.Replicas(ctx); return err },
			wantMsg:  "/status: answer has no replicas field",
			requests: []string{"GET|/status|||"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.hook
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			o := scaler.WebhookOptions{URL: srv.URL + "/scale", Pool: "long", Token: tt.token, Timeout: tt.timeout}
			if tt.status {
				o.StatusURL = srv.URL + "/status"
			}
			w, err := scaler.NewWebhook(o)
			if err != nil {
				t.Fatal(err)
			}
			err = tt.run(context.Background(), w)
			want := tt.wantErr
			if want == nil && tt.wantMsg != "" {
				want = err // any error, checked by message
				if err == nil {
					t.Fatal("no error")
				}
			}
			checkErr(t, err, want, tt.wantMsg, tt.permanent)
			if got := h.log(); strings.Join(got, "\n") != strings.Join(tt.requests, "\n") {
				t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.requests, "\n"))
			}
		})
	}
}

func TestNewWebhook(t *testing.T) {
	_, err := scaler.NewWebhook(scaler.WebhookOptions{URL: "nope", StatusURL: "also nope"})
	want := `webhook scaler: URL: URL must be absolute http(s), got "nope"` + "\n" +
		`StatusURL: URL must be absolute http(s), got "also nope"` + "\n" +
		"pool must not be empty"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v\nwant %s", err, want)
	}
}
