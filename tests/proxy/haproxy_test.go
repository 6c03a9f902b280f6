package proxy

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// haproxyBin finds HAProxy: $SLUICE_TEST_HAPROXY (make sets it, and then
// a missing HAProxy fails the test), else haproxy on PATH or in
// /usr/sbin, where Debian puts it; else the test is skipped.
func haproxyBin(t *testing.T) string {
	t.Helper()
	find := func(name string) (string, error) {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		return exec.LookPath(filepath.Join("/usr/sbin", filepath.Base(name)))
	}
	if name := os.Getenv("SLUICE_TEST_HAPROXY"); name != "" {
		p, err := find(name)
		if err != nil {
			t.Fatalf("SLUICE_TEST_HAPROXY=%s: %v (deploy/dev/need.sh haproxy installs it: apt-get install haproxy)", name, err)
		}
		return p
	}
	p, err := find("haproxy")
	if err != nil {
		t.Skip("no haproxy (apt-get install haproxy; make test requires it)")
	}
	return p
}

// haproxyConfig forwards every request to the API as a typical ingress
// does: X-Forwarded-For gets the client's address appended (option
// forwardfor adds a header of its own after whatever the client sent),
// and event streams may stay open for minutes.
const haproxyConfig = `global
  maxconn 8000

defaults
  mode http
  option forwardfor
  timeout connect 5s
  timeout client 10m
  timeout server 10m
  timeout http-request 10s
  maxconn 8000

frontend sluice
  bind %s
  default_backend api

backend api
  server api %s maxconn 8000
`

// startHAProxy runs HAProxy in front of the API at apiURL until the test
// ends and returns its base URL.
func startHAProxy(t *testing.T, apiURL string) string {
	t.Helper()
	api, err := url.Parse(apiURL)
	if err != nil {
		t.Fatal(err)
	}
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(haproxyConfig, listen, api.Host)), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "haproxy.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(haproxyBin(t), "-db", "-f", cfg)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start haproxy: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = log.Close()
		if t.Failed() {
			t.Logf("haproxy log:\n%s", testenv.Tail(logPath, 20))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", listen)
		if err == nil {
			_ = c.Close()
			return "http://" + listen
		}
		select {
		case err := <-exited:
			t.Fatalf("haproxy exited: %v\n%s", err, testenv.Tail(logPath, 20))
		case <-ctx.Done():
			t.Fatalf("haproxy not listening on %s: %v", listen, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
