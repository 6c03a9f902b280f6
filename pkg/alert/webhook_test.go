package alert_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/alert"
)

func TestSend(t *testing.T) {
	got := make(chan map[string]any, 2)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&body) != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		got <- body
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	w := alert.Webhook{URL: hook.URL + "/alerts"}
	ctx := context.Background()
	health := struct{ Ratio float64 }{7.2}
	before := time.Now()
	if err := w.Send(ctx, alert.Alert{Pool: "short", Level: "critical", Message: "P99/P50 = 7.2", Health: health}); err != nil {
		t.Fatal(err)
	}
	body := <-got
	if body["pool"] != "short" || body["level"] != "critical" || body["message"] != "P99/P50 = 7.2" {
		t.Fatalf("webhook got %v", body)
	}
	if h, _ := body["health"].(map[string]any); h["Ratio"] != 7.2 {
		t.Errorf("health %v, want the value's own JSON", body["health"])
	}
	at, err := time.Parse(time.RFC3339Nano, body["at"].(string))
	if err != nil || at.Before(before.Add(-time.Second)) || at.Location() != time.UTC {
		t.Errorf("at %v (%v), want now in UTC", body["at"], err)
	}
	// A time given is kept.
	raised := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := w.Send(ctx, alert.Alert{Pool: "long", At: raised}); err != nil {
		t.Fatal(err)
	}
	if body := <-got; body["at"] != "2025-03-01T12:00:00Z" {
		t.Errorf("at %v, want the time raised", body["at"])
	}
}

func TestSendWithoutURL(t *testing.T) {
	if err := (alert.Webhook{}).Send(context.Background(), alert.Alert{Pool: "short"}); err != nil {
		t.Fatalf("no webhook: %v", err)
	}
}

func TestSendFailures(t *testing.T) {
	ctx := context.Background()
	var calls atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	}))
	t.Cleanup(hook.Close)
	err := alert.Webhook{URL: hook.URL}.Send(ctx, alert.Alert{Pool: "short"})
	if err == nil || !strings.Contains(err.Error(), "502") || errors.Is(err, alert.ErrInvalid) {
		t.Errorf("5xx: %v, want a retryable error naming the status", err)
	}
	if err := (alert.Webhook{URL: "http://127.0.0.1:1"}).Send(ctx, alert.Alert{Pool: "short"}); err == nil || errors.Is(err, alert.ErrInvalid) {
		t.Errorf("unreachable: %v, want a retryable error", err)
	}
	if err := (alert.Webhook{URL: "http://[::1"}).Send(ctx, alert.Alert{Pool: "short"}); !errors.Is(err, alert.ErrInvalid) {
		t.Errorf("malformed URL: %v, want ErrInvalid", err)
	}
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	if err := (alert.Webhook{URL: slow.URL, Timeout: 50 * time.Millisecond}).Send(ctx, alert.Alert{Pool: "short"}); err == nil {
		t.Error("a hung webhook: no error")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the failing hook was called %d times, want 1 (Send does not retry)", n)
	}
}
