package testenv

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of redis-server processes owned by a
// test: three masters, each with one replica, on loopback.
type RedisCluster struct {
	// Addrs are the nodes' addresses, masters first.
	Addrs []string
	nodes []*Redis
}

// clusterNodes is three masters and a replica of each: the smallest
// cluster redis-cli creates with replicas.
const clusterNodes = 6

// LaunchRedisCluster starts a Redis Cluster (six redis-server processes
// in cluster mode, persistence off) on free loopback ports, creates it
// with redis-cli and waits until every node serves all slots. It fails if
// redis-server or redis-cli is missing: tests always use the real server.
// The caller must call Stop.
func LaunchRedisCluster(ctx context.Context) (*RedisCluster, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH (apt-get install redis-server): %w", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redis-cli not found on PATH (apt-get install redis-tools): %w", err)
	}
	c := &RedisCluster{}
	for range clusterNodes {
		n, err := launchClusterNode(bin)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.waitReady(ctx, 30*time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// launchClusterNode starts one node in cluster mode, its cluster bus on a
// port of its own (not port+10000, which may be taken); a node that exits
// before it is ready (a port taken meanwhile) is started again on others.
func launchClusterNode(bin string) (*Redis, error) {
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		bus, err := FreePort()
		if err != nil {
			return nil, err
		}
		r, err := launchRedis(bin, port,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "{dir}/nodes.conf",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "5000",
		)
		if err == nil || !errors.Is(err, errExited) || attempt == 5 {
			return r, err
		}
	}
}

// waitReady waits until every node says cluster_state:ok and knows every
// node and slot: then a cluster client routes every key from its first
// command on.
func (c *RedisCluster) waitReady(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for _, addr := range c.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		var info string
		var err error
		for {
			info, err = node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_slots_ok:16384") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(clusterNodes)) {
				break
			}
			if ctx.Err() != nil {
				_ = node.Close()
				return fmt.Errorf("redis cluster node %s not ready after %v: %v %s", addr, within, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = node.Close()
	}
	return nil
}

// Client returns a cluster client of this cluster, closed with the test.
func (c *RedisCluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping redis cluster %v: %v", c.Addrs, err)
	}
	return rdb
}

// Kill stops the node at addr with SIGKILL, as a crashed machine: its
// replica takes over its slots once the others stop hearing from it
// (cluster-node-timeout, 5 s).
func (c *RedisCluster) Kill(addr string) error {
	for _, n := range c.nodes {
		if n.Addr == addr {
			n.Stop()
			return nil
		}
	}
	return fmt.Errorf("no node of the cluster at %s", addr)
}

// Stop kills every node and removes their directories. It may be called
// again.
func (c *RedisCluster) Stop() {
	for _, n := range c.nodes {
		n.Stop()
	}
}
