package conn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// Each way a real Redis can be out of reach for a while is told apart
// from a command that is simply wrong.
func TestUnreachable(t *testing.T) {
	ctx := context.Background()
	plain := testenv.StartRedis(t)
	// A cluster node that serves no slot answers as a cluster's slot
	// without a master does during a failover.
	noSlots := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "{dir}/nodes.conf")
	// A replica (of a master that is not there) refuses writes, as a
	// demoted master does.
	replica := testenv.StartRedis(t, "--replicaof", "127.0.0.1", "1")

	cases := []struct {
		name string
		err  func(t *testing.T) error
		want bool
	}{
		{"slot without a master", func(t *testing.T) error {
			return redis.NewClient(&redis.Options{Addr: noSlots.Addr, MaxRetries: -1}).Set(ctx, "k", 1, 0).Err()
		}, true},
		{"read-only replica", func(t *testing.T) error { return replica.Client(t).Set(ctx, "k", 1, 0).Err() }, true},
		{"connection refused", func(t *testing.T) error {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			_ = l.Close()
			return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1}).Ping(ctx).Err()
		}, true},
		{"server gone mid-connection", func(t *testing.T) error {
			r := testenv.StartRedis(t)
			c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			r.Stop()
			return c.Ping(ctx).Err()
		}, true},
		{"closed client", func(t *testing.T) error {
			c := redis.NewClient(&redis.Options{Addr: plain.Addr})
			_ = c.Close()
			return fmt.Errorf("read queue: %w", c.Ping(ctx).Err())
		}, true},
		{"wrong type", func(t *testing.T) error {
			c := plain.Client(t)
			c.Set(ctx, "s", "x", 0)
			return c.LPush(ctx, "s", 1).Err()
		}, false},
		{"missing key", func(t *testing.T) error { return plain.Client(t).Get(ctx, "nope").Err() }, false},
		{"script error", func(t *testing.T) error {
			return plain.Client(t).Eval(ctx, "return redis.error_reply('BAD x')", nil).Err()
		}, false},
		{"caller's deadline", func(t *testing.T) error {
			c, cancel := context.WithCancel(ctx)
			cancel()
			return plain.Client(t).Ping(c).Err()
		}, false},
		{"no error", func(*testing.T) error { return nil }, false},
		{"not redis", func(*testing.T) error { return errors.New("embedder said no") }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.err(t)
			if got := Unreachable(err); got != c.want {
				t.Fatalf("Unreachable(%v) = %t, want %t", err, got, c.want)
			}
		})
	}
}
