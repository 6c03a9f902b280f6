package api

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

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
	if srv.door.Draining() {
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
