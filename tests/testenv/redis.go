// Package testenv starts the real components Sluice's tests run against: a
// redis-server on a free loopback port and the pinned Temporal dev server.
// It is imported by tests only.
package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a redis-server process owned by a test (or a TestMain).
type Redis struct {
	Addr string
	bin  string
	port int
	cmd  *exec.Cmd
	dir  string
}

// StartRedis starts redis-server on a free loopback port with persistence
// off, with extra arguments after the common ones ("{dir}" in them is its
// directory). It fails the test if redis-server is not installed: tests
// always use the real server (.ci/run installs it).
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	r, err := LaunchRedis(extra...)
	if err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(r.Stop)
	return r
}

// LaunchRedis is StartRedis for a TestMain, where no testing.TB exists.
// The caller must call Stop.
func LaunchRedis(extra ...string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH (apt-get install redis-server): %w", err)
	}
	// A free port can be taken by another test binary between asking for
	// it and binding it (go test runs packages in parallel): a server that
	// exits before it is ready is started again on another port.
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		r, err := launchRedis(bin, port, extra...)
		if err == nil || !errors.Is(err, errExited) || attempt == 5 {
			return r, err
		}
	}
}

// Restart kills the server (SIGKILL: a crash, not a shutdown) and starts
// an empty one on the same port, as a Redis without persistence that
// crashed and came back looks to its clients: every key is gone.
func (r *Redis) Restart() error { return r.RestartAfter(0) }

// RestartAfter is Restart with the server down for d in between: an
// outage, not a blip.
func (r *Redis) RestartAfter(d time.Duration) error {
	r.Stop()
	time.Sleep(d)
	// The port was just released; a server that cannot bind it yet (the
	// kernel still tearing the old socket down) is started again.
	var err error
	for attempt := 1; attempt <= 20; attempt++ {
		var next *Redis
		if next, err = launchRedis(r.bin, r.port); err == nil {
			*r = *next
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("restart redis-server on %s: %w", r.Addr, err)
}

var errExited = errors.New("redis-server exited before it was ready")

// launchRedis starts one redis-server on port, with extra arguments after
// the common ones (a cluster node's); "{dir}" in them is its directory.
func launchRedis(bin string, port int, extra ...string) (*Redis, error) {
	dir, err := os.MkdirTemp("", "sluice-redis-")
	if err != nil {
		return nil, err
	}
	args := []string{
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(port),
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--protected-mode", "yes",
	}
	for _, a := range extra {
		args = append(args, strings.ReplaceAll(a, "{dir}", dir))
	}
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(port), bin: bin, port: port, cmd: cmd, dir: dir}
	ready, exited := make(chan struct{}), make(chan struct{})
	var log strings.Builder
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			if log.Len() < 8<<10 {
				log.WriteString(sc.Text() + "\n")
			}
			if !signalled && strings.Contains(sc.Text(), "Ready to accept connections") {
				close(ready)
				signalled = true
			}
		}
	}()
	select {
	case <-ready:
	case <-exited:
		r.Stop()
		return nil, fmt.Errorf("%w on %s: %s", errExited, r.Addr, log.String())
	case <-time.After(10 * time.Second):
		r.Stop()
		return nil, fmt.Errorf("redis-server on %s not ready after 10s", r.Addr)
	}
	return r, nil
}

// Client returns a go-redis client for this server, closed with the test.
func (r *Redis) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping redis %s: %v", r.Addr, err)
	}
	return c
}

// Stop kills the server and removes its directory. It may be called
// again (Cleanup after Restart).
func (r *Redis) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
	_ = os.RemoveAll(r.dir)
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// RepoRoot walks up from the working directory to the directory holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// RedisMain runs a package's tests against one redis-server for all of
// them; set receives it before the tests run. Use it as
// `func TestMain(m *testing.M) { os.Exit(testenv.RedisMain(m, func(r *testenv.Redis) { srv = r })) }`.
func RedisMain(m *testing.M, set func(*Redis)) int {
	r, err := LaunchRedis()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer r.Stop()
	set(r)
	return m.Run()
}

// KeyPrefix gives each test its own key space on a shared server.
func KeyPrefix(t testing.TB) string {
	return "test:" + strings.ReplaceAll(t.Name(), "/", ":") + ":"
}
