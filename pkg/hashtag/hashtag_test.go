package hashtag

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// The cases of the Redis Cluster specification's "Hash tags" section.
func TestOfFollowsRedisCluster(t *testing.T) {
	for key, want := range map[string]string{
		"{user1000}.following":                   "user1000",
		"foo{}{bar}":                             "foo{}{bar}",
		"foo{{bar}}zap":                          "{bar",
		"foo{bar}{zap}":                          "bar",
		"sluice:plain":                           "sluice:plain",
		"sluice:{open":                           "sluice:{open",
		"sluice:rl3:{t:acme}:tenant:acme:tokens": "t:acme",
	} {
		if got := Of(key); got != want {
			t.Errorf("Of(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestSplitsOnlyForClientsOfManyServers(t *testing.T) {
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer single.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	var universal redis.UniversalClient = cluster
	if Splits(single) || !Splits(cluster) || !Splits(universal) {
		t.Fatalf("Splits: single %v, cluster %v, cluster as UniversalClient %v", Splits(single), Splits(cluster), Splits(universal))
	}
}
