package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// stack is a whole Sluice on loopback (redis-server, the Temporal dev
// server, the LLM simulator, the API with its embedded worker) behind
// HAProxy.
type stack struct {
	t   *testing.T
	cfg config.Config
	// proxyURL is HAProxy's base URL, the one clients use.
	proxyURL string
}

// proxyNet is the address HAProxy connects to the API from: the one
// trusted proxy. Clients come from 127.1.0.0/16.
const proxyNet = "127.0.0.1/32"

// startStack starts everything, with the configuration adjusted by
// configure, and stops it when the test ends.
func startStack(t *testing.T, configure func(*config.Config)) *stack {
	t.Helper()
	haproxyBin(t) // skip or fail before starting the rest
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rds, err := testenv.LaunchRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rds.Stop)
	ts, err := testenv.LaunchTemporal(ctx, workflows.SearchAttributeNames)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ts.Stop() })
	sim, err := llmsim.New(llmsim.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	simSrv := httptest.NewServer(sim.Handler())
	t.Cleanup(func() { simSrv.CloseClientConnections(); simSrv.Close(); sim.Close() })

	cfg := config.Default()
	cfg.Redis.Addr = rds.Addr
	cfg.Temporal.HostPort = ts.FrontendHostPort()
	cfg.Pools.Short.Endpoints = []string{simSrv.URL}
	cfg.Pools.Long.Endpoints = []string{simSrv.URL}
	cfg.API.Addr = "127.0.0.1:0"
	cfg.API.TrustedProxies = []string{proxyNet}
	// Loopback stays exempt from bans (the default): the exemption is a
	// connection's own address's, and every client here comes through the
	// proxy, which names it, so bans apply to them as to anyone.
	cfg.Healing.Enabled = false
	cfg.Metrics.WorkerAddr = ""
	cfg.Log.Level = "warn"
	cfg.Auth.AllowAnonymous = false
	cfg.Auth.APIKeys = nil
	configure(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := &stack{t: t, cfg: cfg}
	apiLog := filepath.Join(t.TempDir(), "api.log")
	f, err := os.Create(apiLog)
	if err != nil {
		t.Fatal(err)
	}
	api, err := app.StartAPI(ctx, cfg, slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := api.Stop(30 * time.Second); err != nil {
			t.Log(err)
		}
		_ = f.Close()
		if t.Failed() {
			t.Logf("api log:\n%s", testenv.Tail(apiLog, 30))
		}
	})
	s.proxyURL = startHAProxy(t, api.URL)
	return s
}

// waitReady waits until a request of key's through the proxy is
// answered: the kb is seeded and the worker polls.
func (s *stack) waitReady(from, key string) {
	s.t.Helper()
	hc := clientFrom(from, "")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r := chatclient.Send(context.Background(), hc, s.proxyURL, chatclient.Request{Key: key, MaxTokens: 4, Bound: 30 * time.Second})
		if r.Terminal == "done" {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("stack not ready: last request %s", r.Summary())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// metrics is the API's /metrics page, read through the proxy.
func (s *stack) metrics() string {
	s.t.Helper()
	resp, err := http.Get(s.proxyURL + "/metrics")
	if err != nil {
		s.t.Fatalf("read metrics: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("read metrics: %v", err)
	}
	return string(raw)
}

// metricLines are the samples of name on a /metrics page whose value is
// not 0.
func metricLines(page, name string) []string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, name) && !strings.HasSuffix(l, " 0") {
			out = append(out, l)
		}
	}
	return out
}

// clientFrom is an HTTP client whose connections come from the local
// address from and whose requests carry forged, if not empty, as their
// X-Forwarded-For.
func clientFrom(from, forged string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4, DisableCompression: true}
	var rt http.RoundTripper = tr
	if forged != "" {
		rt = forging{base: tr, xff: forged}
	}
	return &http.Client{Transport: rt}
}

// forging writes X-Forwarded-For itself, as a client may.
type forging struct {
	base http.RoundTripper
	xff  string
}

func (f forging) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Forwarded-For", f.xff)
	return f.base.RoundTrip(r)
}

// clientAddr is the i-th client's own loopback address, 127.1.0.0/16.
func clientAddr(i int) string { return fmt.Sprintf("127.1.%d.%d", i/250, i%250+1) }
