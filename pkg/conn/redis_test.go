package conn

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// startTLSRedis starts a redis-server that speaks TLS only, requires a
// client certificate from the test CA, and knows one ACL user, sluice with
// password s3cret (the default user is off). It returns the TLS port.
func startTLSRedis(t *testing.T, pki testPKI) int {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found on PATH (apt-get install redis-server): %v", err)
	}
	dir := t.TempDir()
	acl := filepath.Join(dir, "users.acl")
	if err := os.WriteFile(acl, []byte("user default off\nuser sluice on >s3cret ~* &* +@all\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A free port can be taken between asking for it and binding it.
	var last string
	for attempt := 0; attempt < 5; attempt++ {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin,
			"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--tls-cert-file", pki.ServerCert, "--tls-key-file", pki.ServerKey,
			"--tls-ca-cert-file", pki.CA, "--tls-auth-clients", "yes",
			"--aclfile", acl, "--save", "", "--appendonly", "no", "--dir", dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make(chan bool, 1)
		var log strings.Builder
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				log.WriteString(sc.Text() + "\n")
				if strings.Contains(sc.Text(), "Ready to accept connections") {
					ready <- true
					for sc.Scan() {
					}
					return
				}
			}
			ready <- false
		}()
		select {
		case ok := <-ready:
			if ok {
				t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
				return port
			}
		case <-time.After(10 * time.Second):
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		last = log.String()
	}
	t.Fatalf("redis-server with TLS did not start:\n%s", last)
	return 0
}

// A rediss:// URL with an ACL user reaches a real TLS-only Redis: PING and
// a script run; a wrong password, a missing client certificate and an
// unknown CA each fail, saying why.
func TestRedisTLSWithACLUser(t *testing.T) {
	pki := newTestPKI(t)
	port := startTLSRedis(t, pki)
	mtls := TLS{Enabled: true, CAFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey}
	base := Redis{Timeout: 2 * time.Second}
	url := func(userinfo string) string { return fmt.Sprintf("rediss://%slocalhost:%d/0", userinfo, port) }

	connect := func(t *testing.T, r Redis) (redis.UniversalClient, error) {
		t.Helper()
		c, err := NewRedis(r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c, c.Ping(ctx).Err()
	}

	t.Run("user and password in the url", func(t *testing.T) {
		r := base
		r.URL, r.TLS = url("sluice:s3cret@"), mtls
		c, err := connect(t, r)
		if err != nil {
			t.Fatalf("ping: %v", err)
		}
		if _, ok := c.(*redis.Client); !ok {
			t.Fatalf("client is %T, want a single-node *redis.Client", c)
		}
		ctx := context.Background()
		if who, err := c.Do(ctx, "ACL", "WHOAMI").Text(); err != nil || who != "sluice" {
			t.Fatalf("ACL WHOAMI = %q, %v", who, err)
		}
		n, err := redis.NewScript(`return redis.call("INCRBY", KEYS[1], ARGV[1])`).Run(ctx, c, []string{"conn:test"}, 2).Int()
		if err != nil || n != 2 {
			t.Fatalf("script = %d, %v", n, err)
		}
	})
	t.Run("password from redis.password", func(t *testing.T) {
		r := base
		r.URL, r.Password, r.TLS = url("sluice@"), "s3cret", mtls
		if _, err := connect(t, r); err != nil {
			t.Fatalf("ping: %v", err)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		r := base
		r.URL, r.TLS = url("sluice:wrong@"), mtls
		_, err := connect(t, r)
		if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("ping with a wrong password: %v, want WRONGPASS", err)
		}
	})
	t.Run("no client certificate", func(t *testing.T) {
		r := base
		r.URL, r.TLS = url("sluice:s3cret@"), TLS{Enabled: true, CAFile: pki.CA}
		if _, err := connect(t, r); err == nil || !strings.Contains(err.Error(), "tls") {
			t.Fatalf("ping without a client certificate: %v, want a TLS error", err)
		}
	})
	t.Run("server's CA unknown", func(t *testing.T) {
		r := base
		r.URL, r.TLS = url("sluice:s3cret@"), TLS{Enabled: true, CertFile: pki.ClientCert, KeyFile: pki.ClientKey}
		if _, err := connect(t, r); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("ping trusting only the system's CAs: %v, want an unknown authority", err)
		}
	})
}

func TestRedisOptions(t *testing.T) {
	base := Redis{Timeout: 3 * time.Second}
	for _, c := range []struct {
		name    string
		set     func(*Redis)
		addrs   []string
		cluster bool
		master  string
		user    string
		pass    string
		db      int
		tls     bool
		client  string
	}{
		{"addr", func(r *Redis) { r.Addr, r.Password, r.DB = "r:6379", "pw", 2 }, []string{"r:6379"}, false, "", "", "pw", 2, false, "*redis.Client"},
		{"addrs", func(r *Redis) { r.Addrs, r.Cluster, r.Username = []string{"r-0:6379"}, true, "sluice" }, []string{"r-0:6379"}, true, "", "sluice", "", 0, false, "*redis.ClusterClient"},
		{"url", func(r *Redis) { r.URL, r.TLS.Enabled = "rediss://sluice:pw@r.example.com:6380/3", true }, []string{"r.example.com:6380"}, false, "", "sluice", "pw", 3, true, "*redis.Client"},
		{"url, db from redis.db", func(r *Redis) { r.URL, r.DB = "redis://r:6379", 4 }, []string{"r:6379"}, false, "", "", "", 4, false, "*redis.Client"},
		{"cluster url", func(r *Redis) {
			r.URL, r.Cluster, r.TLS.Enabled = "rediss://:pw@r-0:6379?addr=r-1:6379&addr=r-2:6379", true, true
		}, []string{"r-0:6379", "r-1:6379", "r-2:6379"}, true, "", "", "pw", 0, true, "*redis.ClusterClient"},
		{"sentinel", func(r *Redis) {
			r.Sentinel = Sentinel{MasterName: "mymaster", Addrs: []string{"s-0:26379"}, Password: "spw"}
			r.Password = "pw"
		}, []string{"s-0:26379"}, false, "mymaster", "", "pw", 0, false, "*redis.Client"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := base
			c.set(&r)
			o, err := RedisOptions(r)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.Addrs, c.addrs) || o.IsClusterMode != c.cluster || o.MasterName != c.master ||
				o.Username != c.user || o.Password != c.pass || o.DB != c.db || (o.TLSConfig != nil) != c.tls {
				t.Fatalf("options %+v", o)
			}
			if o.PoolSize != redisPoolSize || !o.ContextTimeoutEnabled || o.ReadTimeout != r.Timeout {
				t.Fatalf("pool and timeouts %+v", o)
			}
			if c.master != "" && o.SentinelPassword != "spw" {
				t.Fatalf("sentinel password %q", o.SentinelPassword)
			}
			client, err := NewRedis(r)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			if got := fmt.Sprintf("%T", client); got != c.client {
				t.Fatalf("client %s, want %s", got, c.client)
			}
		})
	}
}

func TestRedisTargetHidesPassword(t *testing.T) {
	r := Redis{URL: "rediss://sluice:s3cret@r.example.com:6380/0"}
	if got := RedisTarget(r); strings.Contains(got, "s3cret") || !strings.Contains(got, "r.example.com:6380") {
		t.Fatalf("target %q", got)
	}
}
