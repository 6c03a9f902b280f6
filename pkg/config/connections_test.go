package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Each way to reach Redis can be chosen from the environment alone, and
// choosing one drops the default addr instead of clashing with it.
func TestRedisWaysFromEnv(t *testing.T) {
	cfg, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Addr != defaultRedisAddr || cfg.Redis.Cluster() || cfg.Redis.UsesTLS() {
		t.Fatalf("default redis = %+v", cfg.Redis)
	}

	cfg, err = Load("", []string{"SLUICE_REDIS_URL=rediss://sluice@redis.example.com:6380/0", "SLUICE_REDIS_PASSWORD=s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Addr != "" || cfg.Redis.Password != "s3cret" || !cfg.Redis.UsesTLS() || cfg.Redis.Cluster() {
		t.Fatalf("url from env: %+v", cfg.Redis)
	}

	cfg, err = Load("", []string{"SLUICE_REDIS_ADDRS=redis-0:6379, redis-1:6379", "SLUICE_REDIS_TLS_ENABLED=true", "SLUICE_REDIS_TLS_CA_FILE=/etc/ca.pem"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Redis.Addrs, []string{"redis-0:6379", "redis-1:6379"}) || !cfg.Redis.Cluster() ||
		cfg.Redis.TLS.Enabled == nil || !*cfg.Redis.TLS.Enabled || !cfg.Redis.UsesTLS() {
		t.Fatalf("cluster from env: %+v", cfg.Redis)
	}

	cfg, err = Load("", []string{"SLUICE_REDIS_SENTINEL_MASTER_NAME=mymaster", "SLUICE_REDIS_SENTINEL_ADDRS=s-0:26379,s-1:26379", "SLUICE_REDIS_SENTINEL_PASSWORD=x"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Addr != "" || len(cfg.Redis.Sentinel.Addrs) != 2 || cfg.Redis.Sentinel.Password != "x" {
		t.Fatalf("sentinel from env: %+v", cfg.Redis)
	}
}

func TestRedisEnvErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"SLUICE_REDIS_ADDR=10.0.0.1:6379", "SLUICE_REDIS_URL=redis://r:6379"}, "redis.url: set only one of redis.addr, redis.addrs, redis.url and redis.sentinel; redis.addr is set too"},
		{[]string{"SLUICE_REDIS_ADDRS=r-0:6379", "SLUICE_REDIS_DB=1"}, "redis.db: must be 0 with a Redis Cluster"},
		{[]string{"SLUICE_REDIS_TLS_ENABLED=maybe"}, "SLUICE_REDIS_TLS_ENABLED: want true or false"},
		{[]string{"SLUICE_REDIS_URL=redis://u:p@r:6379", "SLUICE_REDIS_PASSWORD=q"}, "redis.password: must not be set when redis.url carries a password"},
		{[]string{"SLUICE_REDIS_URL=rediss://u:topsecret@:6379"}, `redis.url: must name a host (redis://host:port), got "rediss://u:xxxxx@:6379"`},
		{[]string{"SLUICE_REDIS_URL=redis://r:6379/zero"}, `redis.url: path must be a database number such as /0, got "/zero"`},
	} {
		_, err := Load("", c.env)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want it to contain %q", c.env, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "topsecret") {
			t.Errorf("%v: error shows the password: %v", c.env, err)
		}
	}
}

// Temporal settings layer: this file or SLUICE_TEMPORAL_*, then TEMPORAL_*
// variables, then the Temporal profile file, then the defaults.
func TestTemporalLayers(t *testing.T) {
	dir := t.TempDir()
	profile := filepath.Join(dir, "temporal.toml")
	if err := os.WriteFile(profile, []byte(`
[profile.cloud]
address = "us-east-1.aws.api.temporal.io:7233"
namespace = "from-profile.a1b2c"
api_key = "profile-key"
[profile.mtls]
address = "sluice.a1b2c.tmprl.cloud:7233"
namespace = "sluice.a1b2c"
[profile.mtls.tls]
client_cert_path = "/etc/temporal/client.pem"
client_key_path = "/etc/temporal/client.key"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
		want Temporal
	}{
		{"defaults", nil, Temporal{HostPort: "127.0.0.1:7233", Namespace: "default"}},
		{"TEMPORAL_* variables", []string{"TEMPORAL_ADDRESS=t.example.com:7233", "TEMPORAL_NAMESPACE=prod", "TEMPORAL_API_KEY=k"},
			Temporal{HostPort: "t.example.com:7233", Namespace: "prod", APIKey: "k"}},
		{"sluice over TEMPORAL_*", []string{"TEMPORAL_ADDRESS=t.example.com:7233", "SLUICE_TEMPORAL_HOST_PORT=mine:7233", "TEMPORAL_NAMESPACE=prod"},
			Temporal{HostPort: "mine:7233", Namespace: "prod"}},
		{"TEMPORAL_TLS=false beats the API key's TLS", []string{"TEMPORAL_API_KEY=k", "TEMPORAL_TLS=false"},
			Temporal{HostPort: "127.0.0.1:7233", Namespace: "default", APIKey: "k", TLS: TLS{Enabled: Bool(false)}}},
		{"TEMPORAL_TLS_* paths", []string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH=/ca.pem", "TEMPORAL_TLS_SERVER_NAME=t.internal", "SLUICE_TEMPORAL_TLS_SERVER_NAME=mine.internal"},
			Temporal{HostPort: "127.0.0.1:7233", Namespace: "default", TLS: TLS{Enabled: Bool(true), CAFile: "/ca.pem", ServerName: "mine.internal"}}},
		{"sluice tls off beats TEMPORAL_TLS_*", []string{"SLUICE_TEMPORAL_TLS_ENABLED=false", "TEMPORAL_TLS_SERVER_CA_CERT_PATH=/ca.pem"},
			Temporal{HostPort: "127.0.0.1:7233", Namespace: "default", TLS: TLS{Enabled: Bool(false)}}},
		{"profile, env over profile", []string{"TEMPORAL_CONFIG_FILE=" + profile, "TEMPORAL_PROFILE=cloud", "TEMPORAL_NAMESPACE=from-env.a1b2c"},
			Temporal{HostPort: "us-east-1.aws.api.temporal.io:7233", Namespace: "from-env.a1b2c", APIKey: "profile-key"}},
		{"mtls profile", []string{"TEMPORAL_CONFIG_FILE=" + profile, "TEMPORAL_PROFILE=mtls"},
			Temporal{HostPort: "sluice.a1b2c.tmprl.cloud:7233", Namespace: "sluice.a1b2c",
				TLS: TLS{Enabled: Bool(true), CertFile: "/etc/temporal/client.pem", KeyFile: "/etc/temporal/client.key"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Load("", c.env)
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.Temporal
			want := c.want
			want.TaskQueue, want.EagerStart, want.SearchAttributes = got.TaskQueue, got.EagerStart, got.SearchAttributes
			want.MaxConcurrentActivities, want.MaxConcurrentWorkflowTasks = got.MaxConcurrentActivities, got.MaxConcurrentWorkflowTasks
			want.WorkerStopTimeout, want.WorkflowCacheSize = got.WorkerStopTimeout, got.WorkflowCacheSize
			if (got.TLS.Enabled == nil) != (want.TLS.Enabled == nil) || (got.TLS.Enabled != nil && *got.TLS.Enabled != *want.TLS.Enabled) {
				t.Fatalf("tls.enabled = %v, want %v", ptrString(got.TLS.Enabled), ptrString(want.TLS.Enabled))
			}
			got.TLS.Enabled, want.TLS.Enabled = nil, nil
			if got != want {
				t.Fatalf("temporal =\n%+v, want\n%+v", got, want)
			}
		})
	}
}

func TestTemporalProfileErrors(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"TEMPORAL_CONFIG_FILE=" + filepath.Join(t.TempDir(), "none.toml"), "TEMPORAL_PROFILE=cloud"}, "temporal: read TEMPORAL_* variables and the Temporal profile: unable to find profile cloud"},
		{[]string{"TEMPORAL_TLS_CLIENT_CERT_DATA=-----BEGIN CERTIFICATE-----"}, "temporal: inline TLS data (TEMPORAL_TLS_*_DATA or the profile's *_data) is not supported"},
		{[]string{"TEMPORAL_GRPC_META_X_TENANT=acme"}, "temporal: gRPC metadata (TEMPORAL_GRPC_META_* or the profile's grpc_meta) is not supported"},
	} {
		_, err := Load("", c.env)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want it to contain %q", c.env, err, c.want)
		}
	}
}

func ptrString(b *bool) string {
	if b == nil {
		return "unset"
	}
	if *b {
		return "true"
	}
	return "false"
}

// A brace in the key prefix would become every key's hash tag.
func TestKeyPrefixWithoutBraces(t *testing.T) {
	cfg := Default()
	cfg.Redis.KeyPrefix = "app{x}:"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "redis.key_prefix") {
		t.Fatalf("validate: %v, want an error naming redis.key_prefix", err)
	}
}

func TestWorkflowCacheSizeFollowsThePools(t *testing.T) {
	cfg := Default()
	if got := cfg.WorkflowCacheSize(); got != MinWorkflowCacheSize {
		t.Errorf("defaults (16 + 4 permits): %d, want the floor %d", got, MinWorkflowCacheSize)
	}
	cfg.Pools.Short.MaxConcurrency, cfg.Pools.Long.MaxConcurrency = 200, 50
	if got := cfg.WorkflowCacheSize(); got != 1000 {
		t.Errorf("250 permits: %d, want 4 a permit, 1000", got)
	}
	cfg.Temporal.WorkflowCacheSize = 64
	if got := cfg.WorkflowCacheSize(); got != 64 {
		t.Errorf("set to 64: %d", got)
	}
}
