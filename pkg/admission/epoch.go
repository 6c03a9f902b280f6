package admission

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A pool's queue and permits live on the Redis process that serves its
// hash slot. When that process changes — a replica promoted by a
// failover, a restart — the writes of its last moments may be missing on
// the new one (replication and AOF are asynchronous), and after an empty
// restart all of them are: a queued request's place, a grant, a release.
// A grant or a release heals by itself (the holder's renewal finds its
// permit gone and queues again; an unreleased permit's lease runs out),
// but a waiter that waits for its grant's signal does not look again
// before its deadline. The janitors therefore note, per pool, the run id
// of the process serving it; the one that sees it change asks the running
// requests to re-check their places.

//go:embed lua/epoch.lua
var epochLua string

var epochScript = redis.NewScript(epochLua)

// Served says how a pool's Redis process compares with the one noted
// before (CheckServer).
type Served int

const (
	// ServedSame: the process noted before serves the pool.
	ServedSame Served = 0
	// ServedLost: nothing was noted: the pool's keys were lost (or this
	// is the first run against this Redis).
	ServedLost Served = 1
	// ServedMoved: another process serves the pool now: a failover or a
	// restart; the last writes before it may be lost.
	ServedMoved Served = 2
)

func (s Served) String() string {
	switch s {
	case ServedSame:
		return "same"
	case ServedLost:
		return "lost"
	case ServedMoved:
		return "moved"
	}
	return "unknown"
}

// slotMaster is the part of *redis.ClusterClient that finds the node
// serving a key.
type slotMaster interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// ServerOf returns the run id of the Redis process serving pool's keys:
// on a cluster the master of the pool's slot, else the server the
// client talks to (with Sentinel, the current master).
func (g *Gate) ServerOf(ctx context.Context, pool string) (string, error) {
	var node redis.Cmdable = g.cmd
	if c, ok := g.cmd.(slotMaster); ok {
		m, err := c.MasterForKey(ctx, g.epochKey(pool))
		if err != nil {
			return "", fmt.Errorf("find the redis node serving pool %s: %w", pool, err)
		}
		node = m
	}
	info, err := node.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("read the run id of the redis serving pool %s: %w", pool, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok && id != "" {
			return id, nil
		}
	}
	return "", fmt.Errorf("read the run id of the redis serving pool %s: no run_id in INFO server", pool)
}

// CheckServer notes runID (ServerOf) as the process serving pool and says
// how it compares with the one noted before. Of several callers seeing
// the same change, exactly one is told (the script is atomic).
func (g *Gate) CheckServer(ctx context.Context, pool, runID string) (Served, error) {
	n, err := epochScript.Run(ctx, g.rdb, []string{g.epochKey(pool)}, runID).Int()
	if err != nil {
		return ServedSame, fmt.Errorf("note the redis serving pool %s: %w", pool, err)
	}
	return Served(n), nil
}

// epochKey shares the pool's hash tag: it lives and dies with the pool's
// queue and permits.
func (g *Gate) epochKey(pool string) string { return g.keys(pool).epoch }
