package retrieval

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/kbversion.lua
var kbVersionLua string

var kbVersionScript = redis.NewScript(kbVersionLua)

// Versions numbers the contents of kbs built whole by NewKB (the static
// Hybrid retriever, used by tests and benchmarks); kbs served by Live are
// numbered by kbstore instead, under other keys.
//
// Versions numbers kb contents in Redis. A version only ever grows and
// each number belongs to exactly one content hash, so a cache key holding
// (kb, version) can never return results of other content, even while
// workers with old and new content run side by side during a deploy.
type Versions struct {
	rdb    redis.Scripter
	prefix string
}

// NewVersions stores versions under prefix (e.g. "sluice:").
func NewVersions(rdb redis.Scripter, prefix string) *Versions {
	return &Versions{rdb: rdb, prefix: prefix}
}

// VersionKey is the Redis key of kb's version. The braces are a Redis
// Cluster hash tag: both keys of a kb hash to one slot, as the script
// needs.
func (v *Versions) VersionKey(kb string) string { return v.prefix + "kbhash:{" + kb + "}:version" }

// HashKey is the Redis key of the content hash of kb's current version.
func (v *Versions) HashKey(kb string) string { return v.prefix + "kbhash:{" + kb + "}:hash" }

// Sync returns the version of kb's content with the given hash, assigning
// the next version if the hash differs from the one last stored.
func (v *Versions) Sync(ctx context.Context, kb, hash string) (int64, error) {
	n, err := kbVersionScript.Run(ctx, v.rdb, []string{v.VersionKey(kb), v.HashKey(kb)}, hash).Int64()
	if err != nil {
		return 0, fmt.Errorf("sync version of kb %s: %w", kb, err)
	}
	return n, nil
}
