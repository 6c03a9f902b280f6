package app

import (
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
)

// What config decides from the layers (TLS implied by an API key or a
// rediss:// URL, a cluster named by ?addr= seeds) reaches pkg/conn.
func TestConnOptionsFromConfig(t *testing.T) {
	cfg, err := config.Load("", []string{
		"TEMPORAL_ADDRESS=us-east-1.aws.api.temporal.io:7233", "TEMPORAL_NAMESPACE=sluice.a1b2c", "TEMPORAL_API_KEY=key-1",
		"SLUICE_REDIS_URL=rediss://:pw@r-0:6379?addr=r-1:6379",
	})
	if err != nil {
		t.Fatal(err)
	}
	to, err := temporalOptions(cfg.Temporal)
	if err != nil {
		t.Fatal(err)
	}
	if to.HostPort != "us-east-1.aws.api.temporal.io:7233" || to.Namespace != "sluice.a1b2c" || to.APIKey != "key-1" || !to.TLS.Enabled {
		t.Fatalf("temporal %+v", to)
	}
	ro, err := redisOptions(cfg.Redis)
	if err != nil {
		t.Fatal(err)
	}
	if !ro.Cluster || !ro.TLS.Enabled || ro.Timeout != cfg.Redis.Timeout {
		t.Fatalf("redis %+v", ro)
	}

	off := cfg.Temporal
	off.TLS.Enabled = config.Bool(false)
	if to, err := temporalOptions(off); err != nil || to.TLS.Enabled {
		t.Fatalf("temporal.tls.enabled false: %+v, %v", to, err)
	}
	r := config.Default().Redis
	r.Sentinel = config.Sentinel{MasterName: "mymaster", Addrs: []string{"s-0:26379"}, Password: "spw"}
	r.Addr = ""
	if ro, err := redisOptions(r); err != nil || ro.Sentinel.MasterName != "mymaster" || !slices.Equal(ro.Sentinel.Addrs, r.Sentinel.Addrs) || ro.Sentinel.Password != "spw" || ro.Cluster || ro.TLS.Enabled {
		t.Fatalf("sentinel %+v, %v", ro, err)
	}

	// A section built by hand is checked before it is used.
	bad := config.Default().Redis
	bad.URL = "redis://r:6379"
	if _, err := redisOptions(bad); err == nil || !strings.Contains(err.Error(), "set only one of redis.addr") {
		t.Fatalf("addr and url: %v", err)
	}
}
