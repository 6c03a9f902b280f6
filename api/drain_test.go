package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-dev/sluice/pkg/config"
)

// healthyTemporal answers health checks, so that /readyz is ready until
// the drain begins.
type healthyTemporal struct{ client.Client }

func (healthyTemporal) CheckHealth(context.Context, *client.CheckHealthRequest) (*client.CheckHealthResponse, error) {
	return &client.CheckHealthResponse{}, nil
}

// After the stop signal the API keeps serving for api.drain_delay with
// /readyz failing, so that load balancers take it out before the listener
// closes; then it stops accepting.
func TestReadyzFailsWhileDraining(t *testing.T) {
	const delay = 1500 * time.Millisecond
	srv, _, _ := newTestServer(t, func(c *config.Config) {
		c.API.Addr = "127.0.0.1:0"
		c.API.ShutdownTimeout = time.Second
		c.API.DrainDelay = delay
	})
	srv.temporal = healthyTemporal{srv.temporal}
	runHub(t, srv)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addrCh, done := make(chan string, 1), make(chan error, 1)
	go func() { done <- srv.Run(ctx, func(a string) { addrCh <- a }, nil) }()
	base := "http://" + <-addrCh
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := hc.Get(base + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /readyz before the stop signal: %v %v, want 200", resp, err)
	}

	stopped := time.Now()
	stop()
	waitFor(t, "/readyz to fail", func() bool {
		resp, err := hc.Get(base + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Ready    bool `json:"ready"`
			Draining bool `json:"draining"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode == http.StatusServiceUnavailable && body.Draining && !body.Ready
	})
	// Still serving other requests during the delay.
	resp, err := hc.Get(base + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz while draining: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz while draining: %d, want 200", resp.StatusCode)
	}
	if srv.follow.Draining() {
		t.Error("streams were told to drain before the drain delay ended")
	}

	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(delay + 5*time.Second):
		t.Fatal("Run did not return after the drain delay")
	}
	if took := time.Since(stopped); took < delay {
		t.Errorf("Run returned %s after the stop signal, before api.drain_delay (%s)", took, delay)
	}
	if _, err := hc.Get(base + "/healthz"); err == nil {
		t.Error("the listener still accepts after the drain")
	}
}

// A shared dependency that is down is shown by /readyz, not acted on:
// every instance would leave the balancer at once, and clients would get
// its bare error instead of Sluice's 503 with Retry-After.
func TestReadyWhileADependencyIsDown(t *testing.T) {
	srv, _, _ := newTestServer(t, nil)
	srv.temporal = healthyTemporal{srv.temporal}
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	srv.redis = down
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"redis":"unavailable"`) ||
		!strings.Contains(rec.Body.String(), `"temporal":"ok"`) || strings.Contains(rec.Body.String(), "127.0.0.1") {
		t.Fatalf("/readyz with Redis down: %d %s; want 200, redis shown unavailable, no address", rec.Code, rec.Body)
	}
}
