// Package cluster runs every Lua script and every transaction of Sluice's
// Redis packages, through their Go APIs, against a real Redis Cluster
// (three masters and their replicas) with a go-redis ClusterClient: a key
// layout that puts one call's keys in two hash slots fails here with
// CROSSSLOT (keys declared to a script or named in a MULTI), or with
// "Script attempted to access keys that do not hash to the same slot" /
// "… a non local key" (keys a script builds itself). The client runs
// every script as if it began with a "#!lua" shebang (strictScripts), so
// that the second kind is refused even when the key's slot is on the
// script's own node, where Redis lets an old-style script touch it.
// TestLayoutsThatFail shows that each kind is caught.
//
// Every test uses keys under its own prefix, so the tests share one
// cluster; it starts in a few seconds.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var cluster *testenv.RedisCluster

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	c, err := testenv.LaunchRedisCluster(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cluster = c
	code := m.Run()
	c.Stop()
	os.Exit(code)
}

// client is a cluster client for one test, with strict scripts, and its
// key prefix: new for each run (-count), since the keys outlive a test.
// The prefix has no hash tag: each layout brings its own.
func client(t *testing.T) (*redis.ClusterClient, string) {
	t.Helper()
	rdb := cluster.Client(t)
	rdb.AddHook(strictScripts{})
	return rdb, testenv.KeyPrefix(t) + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}

// strictScripts runs every script with a "#!lua" shebang line before its
// body (with the no-writes flag for the read-only commands). Redis 7 lets
// a script without one touch undeclared keys of other slots on its own
// node, for compatibility, and refuses only keys of another node: which
// of the two an untagged key is depends on the slot map, so a layout
// fault would fail the test by chance only. A script with a shebang may
// touch the slot of its declared keys alone, whatever node serves it.
// EVALSHA is answered NOSCRIPT without asking Redis, so that go-redis
// sends the script's source with EVAL, which this rewrites.
type strictScripts struct{}

func (strictScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (strictScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (strictScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		switch cmd.Name() {
		case "evalsha", "evalsha_ro":
			cmd.SetErr(redis.ErrNoScript)
			return cmd.Err()
		case "eval":
			args[1] = "#!lua\n" + fmt.Sprint(args[1])
		case "eval_ro":
			args[1] = "#!lua flags=no-writes\n" + fmt.Sprint(args[1])
		}
		return next(ctx, cmd)
	}
}

// slotErrors are what Redis Cluster and go-redis answer a call whose keys
// are in more than one slot.
var slotErrors = []string{
	"CROSSSLOT",
	"do not hash to the same slot",
	"non local key",
	"No way to dispatch this command",
}

// crossSlot reports whether err says that one call named keys of more
// than one hash slot.
func crossSlot(err error) bool {
	if err == nil {
		return false
	}
	for _, s := range slotErrors {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return errors.Is(err, redis.ErrCrossSlot)
}

// ok fails the test on err, saying so when it is a key layout that spans
// slots.
func ok(t *testing.T, what string, err error) {
	t.Helper()
	if crossSlot(err) {
		t.Fatalf("%s: its keys are in more than one hash slot: %v", what, err)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// logger writes to the test's log: the packages that survive a Redis
// failure (the retrieval cache) say there what failed.
func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// The harness can fail: a script whose declared keys are in two slots,
// one whose key built inside it is in another slot than its declared one
// (the retrieval cache's layout before its hash tag), and a MULTI over
// two slots (the policy counter's before) are each refused, and crossSlot
// recognises every refusal.
func TestLayoutsThatFail(t *testing.T) {
	rdb, prefix := client(t)
	ctx := context.Background()
	declared := redis.NewScript(`return redis.call('MGET', KEYS[1], KEYS[2])`)
	err := declared.Run(ctx, rdb, []string{prefix + "kb:{docs}:version", prefix + "ret:docs:v1"}).Err()
	if !crossSlot(err) {
		t.Errorf("a script declaring keys of two slots: %v, want a cross-slot error", err)
	}
	built := redis.NewScript(`redis.call('GET', KEYS[1]); return redis.call('GET', ARGV[1])`)
	// Keys of other slots, on whichever node serves them.
	for _, other := range []string{"ret:docs:v1", "ret:docs:v2", "ret:docs:v3", "ret:docs:v4"} {
		err = built.Run(ctx, rdb, []string{prefix + "kb:{docs}:version"}, prefix+other).Err()
		if !crossSlot(err) {
			t.Errorf("a script building key %s of another slot: %v, want a cross-slot error", other, err)
		}
	}
	// The same script with the keys under one tag runs.
	err = built.Run(ctx, rdb, []string{prefix + "kb:{docs}:version"}, prefix+"ret:{docs}:v1").Err()
	if !errors.Is(err, redis.Nil) {
		t.Errorf("a script building a key of its declared key's tag: %v, want redis.Nil", err)
	}
	pipe := rdb.TxPipeline()
	pipe.Incr(ctx, prefix+"policy:version")
	pipe.Get(ctx, prefix+"policy:epoch")
	_, err = pipe.Exec(ctx)
	if !crossSlot(err) {
		t.Errorf("a MULTI over two slots: %v, want a cross-slot error", err)
	}
}
