package testenv

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// ResetServerStats zeroes a test redis-server's command statistics, so
// that ReportScriptTime sees a benchmark's scripts only.
func ResetServerStats(b *testing.B, rdb *redis.Client) {
	b.Helper()
	if err := rdb.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
}

// ReportScriptTime reports the time Redis itself spent running scripts
// (EVAL, EVALSHA and their read-only forms) per op as "redis-µs/op":
// unlike ns/op, it leaves out the client round trips.
func ReportScriptTime(b *testing.B, rdb *redis.Client) {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var usec int64
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(stats), ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				usec += n
			}
		}
	}
	b.ReportMetric(float64(usec)/float64(b.N), "redis-µs/op")
}
