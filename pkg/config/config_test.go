package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

// The example file documents every setting; it must load and equal the
// defaults, so that it cannot drift from them unnoticed.
func TestExampleFileMatchesDefaults(t *testing.T) {
	cfg, err := Load(filepath.Join("..", "..", "deploy", "sluice.example.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	def := Default()
	def.Auth.APIKeys = []APIKey{}
	if !reflect.DeepEqual(cfg.API, def.API) || cfg.Temporal != def.Temporal || !reflect.DeepEqual(cfg.Redis, def.Redis) || cfg.Admission != def.Admission ||
		cfg.Routing != def.Routing || cfg.LLM != def.LLM || cfg.Embedding != def.Embedding || cfg.Rerank != def.Rerank || cfg.Log != def.Log || cfg.Events != def.Events {
		t.Fatalf("example differs from defaults:\n%+v\n%+v", cfg, def)
	}
	if cfg.Pools.Short.MaxConcurrency != def.Pools.Short.MaxConcurrency || cfg.Retrieval.TopK != def.Retrieval.TopK {
		t.Fatal("example pools or retrieval differ from defaults")
	}
	if !slices.Equal(cfg.Retrieval.KnowledgeBases, def.Retrieval.KnowledgeBases) || cfg.Retrieval.DefaultKB != def.Retrieval.DefaultKB {
		t.Fatalf("example knowledge bases differ from defaults: %+v", cfg.Retrieval.KnowledgeBases)
	}
	if !slices.Equal(cfg.AnswerCache.KBs, def.AnswerCache.KBs) || cfg.AnswerCache.TTL != def.AnswerCache.TTL {
		t.Fatalf("example answer cache differs from defaults: %+v", cfg.AnswerCache)
	}
	if cfg.Healing != def.Healing || cfg.Metrics != def.Metrics {
		t.Fatalf("example healing or metrics differ from defaults:\n%+v\n%+v", cfg.Healing, def.Healing)
	}
	for _, p := range []struct{ got, want Pool }{{cfg.Pools.Short, def.Pools.Short}, {cfg.Pools.Long, def.Pools.Long}} {
		if p.got.Healing != p.want.Healing || p.got.Scaler != p.want.Scaler {
			t.Fatalf("example pool healing or scaler differ from defaults: %+v %+v", p.got, p.want)
		}
		if p.got.ConnectTimeout != p.want.ConnectTimeout || p.got.FirstTokenTimeout != p.want.FirstTokenTimeout ||
			p.got.TokenIdleTimeout != p.want.TokenIdleTimeout || p.got.Breaker != p.want.Breaker {
			t.Fatalf("example pool deadlines or breaker differ from defaults: %+v %+v", p.got, p.want)
		}
	}
	if cfg.Auth.AllowAnonymous != def.Auth.AllowAnonymous || cfg.Auth.AdminKey != def.Auth.AdminKey ||
		cfg.Auth.AdminKeySHA256 != def.Auth.AdminKeySHA256 || cfg.Auth.KeyCacheTTL != def.Auth.KeyCacheTTL {
		t.Fatalf("example auth differs from defaults: %+v", cfg.Auth)
	}
	if !reflect.DeepEqual(cfg.Codec, def.Codec) || cfg.Privacy != def.Privacy {
		t.Fatalf("example codec or privacy differ from defaults:\n%+v %+v\n%+v %+v", cfg.Codec, cfg.Privacy, def.Codec, def.Privacy)
	}
	if !reflect.DeepEqual(cfg.Limits.Ban, def.Limits.Ban) {
		t.Fatalf("example limits.ban differs from defaults:\n%+v\n%+v", cfg.Limits.Ban, def.Limits.Ban)
	}
	if cfg.Limits.Enabled != def.Limits.Enabled || cfg.Limits.DefaultTier != def.Limits.DefaultTier || len(cfg.Limits.Tiers) != len(def.Limits.Tiers) {
		t.Fatalf("example limits differ from defaults: %+v", cfg.Limits)
	}
	for name, tier := range def.Limits.Tiers {
		if !reflect.DeepEqual(cfg.Limits.Tiers[name], tier) {
			t.Errorf("example tier %s = %+v, default %+v", name, cfg.Limits.Tiers[name], tier)
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	cfg, err := Load("", []string{
		"SLUICE_REDIS_ADDR=10.0.0.1:6380",
		"SLUICE_ADMISSION_MAX_WAIT=45s",
		"SLUICE_POOLS_SHORT_MAX_CONCURRENCY=7",
		"SLUICE_POOLS_LONG_ENDPOINTS=http://a:1, http://b:2",
		"SLUICE_API_EMBEDDED_WORKER=false",
		"SLUICE_CONFIG=/ignored",
		"SLUICE_TEST_TEMPORAL_BIN=/ignored",
		"PATH=/usr/bin",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.Addr != "10.0.0.1:6380" || cfg.Admission.MaxWait != 45*time.Second || cfg.Pools.Short.MaxConcurrency != 7 ||
		strings.Join(cfg.Pools.Long.Endpoints, "|") != "http://a:1|http://b:2" || cfg.API.EmbeddedWorker {
		t.Fatalf("overrides not applied: %+v", cfg)
	}
}

// The live policy's settings in the file (limits.*, inlined from
// pkg/policy) are set from the environment as any other; its tiers, a
// map, are file-only.
func TestLimitsFromEnv(t *testing.T) {
	cfg, err := Load("", []string{"SLUICE_LIMITS_ENABLED=false", "SLUICE_LIMITS_DEFAULT_TIER=free", "SLUICE_LIMITS_BAN_THRESHOLD=7"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Limits.Enabled || cfg.Limits.DefaultTier != "free" || cfg.Limits.Ban.Threshold != 7 {
		t.Fatalf("limits %+v", cfg.Limits)
	}
	if _, err := Load("", []string{"SLUICE_LIMITS_TIERS=x"}); err == nil || !strings.Contains(err.Error(), "SLUICE_LIMITS_TIERS: unknown setting") {
		t.Fatalf("tiers from the environment: %v", err)
	}
}

func TestPoolDeadlinesAndBreakerFromEnv(t *testing.T) {
	cfg, err := Load("", []string{
		"SLUICE_POOLS_LONG_FIRST_TOKEN_TIMEOUT=45s",
		"SLUICE_POOLS_LONG_BREAKER_SLOW_FIRST_TOKEN=20s",
		"SLUICE_POOLS_SHORT_BREAKER_FAILURES=3",
	})
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Pools.Long; l.ConnectTimeout != 10*time.Second || l.FirstTokenTimeout != 45*time.Second || l.TokenIdleTimeout != 15*time.Second {
		t.Errorf("long pool deadlines %+v", l)
	}
	if b := cfg.Pools.Long.Breaker; b != (Breaker{Failures: 5, OpenFor: 10 * time.Second, SlowFirstToken: 20 * time.Second}) {
		t.Errorf("long pool breaker %+v", b)
	}
	if b := cfg.Pools.Short.Breaker; b.Failures != 3 {
		t.Errorf("short pool breaker %+v", b)
	}
}

// A remote embedder and reranker can be configured from the environment
// alone, so that API keys need not be written into a file.
func TestEnvSelectsRemoteEmbedderAndReranker(t *testing.T) {
	cfg, err := Load("", []string{
		"SLUICE_EMBEDDING_PROVIDER=openai",
		"SLUICE_EMBEDDING_MODEL=text-embedding-3-small",
		"SLUICE_EMBEDDING_DIMS=512",
		"SLUICE_EMBEDDING_ENDPOINT=https://api.openai.com",
		"SLUICE_EMBEDDING_API_KEY=sk-test",
		"SLUICE_RERANK_PROVIDER=http",
		"SLUICE_RERANK_ENDPOINT=http://tei-rerank:8080",
		"SLUICE_RERANK_MODEL=BAAI/bge-reranker-base",
		"SLUICE_RERANK_TIMEOUT=2s",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Embedding{Provider: EmbeddingOpenAI, Model: "text-embedding-3-small", Dims: 512, Endpoint: "https://api.openai.com",
		APIKey: "sk-test", Timeout: 10 * time.Second, CacheTTL: 24 * time.Hour, LRUSize: 10000}
	if cfg.Embedding != want {
		t.Errorf("embedding = %+v, want %+v", cfg.Embedding, want)
	}
	wantR := Rerank{Provider: RerankHTTP, Endpoint: "http://tei-rerank:8080", Model: "BAAI/bge-reranker-base", Timeout: 2 * time.Second, MaxBatch: 32}
	if cfg.Rerank != wantR {
		t.Errorf("rerank = %+v, want %+v", cfg.Rerank, wantR)
	}
}

func TestEnvErrorsNameTheVariable(t *testing.T) {
	for env, want := range map[string]string{
		"SLUICE_REDIS_ADR=x":                   "SLUICE_REDIS_ADR: unknown setting",
		"SLUICE_ADMISSION_MAX_WAIT=ten":        "SLUICE_ADMISSION_MAX_WAIT: want a duration",
		"SLUICE_POOLS_SHORT_MAX_CONCURRENCY=x": "SLUICE_POOLS_SHORT_MAX_CONCURRENCY: want an integer",
		"SLUICE_API_EMBEDDED_WORKER=maybe":     "SLUICE_API_EMBEDDED_WORKER: want true or false",
		"SLUICE_POOLS_SHORT_MAX_CONCURRENCY=0": "pools.short.max_concurrency: must be > 0",
	} {
		_, err := Load("", []string{env})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to contain %q", env, err, want)
		}
	}
}

// One fixture per failure, each with the message a user sees.
func TestBadConfigFixtures(t *testing.T) {
	want := map[string]string{
		"unknown_field.yaml":                    "field adr not found",
		"ingest_metadata_above_body.yaml":       "ingest.max_metadata_bytes: must be at most ingest.max_body_bytes (4096), got 8192",
		"ingest_zero_metadata_bytes.yaml":       "ingest.max_metadata_bytes: must be > 0, got 0",
		"ingest_per_tenant_above_total.yaml":    "ingest.max_concurrent_per_tenant: must be from 0 (half of ingest.max_concurrent) to ingest.max_concurrent (4), got 5",
		"ingest_zero_per_process.yaml":          "ingest.max_concurrent_per_process: must be > 0, got 0",
		"zero_concurrency.yaml":                 "pools.short.max_concurrency: must be > 0, got 0",
		"bad_endpoint.yaml":                     `pools.long.endpoints[0]: must be an http(s) URL, got "127.0.0.1:8000"`,
		"bad_duration.yaml":                     "line 2: cannot unmarshal !!str `soon` into time.Duration",
		"subsecond_recheck.yaml":                "admission.recheck_interval: must be at least 1s",
		"unknown_default_kb.yaml":               `retrieval.default_kb: names unknown knowledge base "nope"`,
		"kb_both_sources.yaml":                  "retrieval.knowledge_bases[0]: set exactly one of builtin or dir",
		"key_and_key_sha256.yaml":               "auth.api_keys[0]: set exactly one of key and key_sha256",
		"key_sha256_not_hex.yaml":               "auth.api_keys[1].key_sha256: must be 64 hex digits (sha256sum of the key)",
		"key_duplicate_by_hash.yaml":            "auth.api_keys[1]: duplicate key",
		"key_unknown_scope.yaml":                `auth.api_keys[0].scopes: unknown scope "root" (want one of chat,ingest,admin)`,
		"admin_key_both.yaml":                   "auth.admin_key_sha256: set at most one of admin_key and admin_key_sha256",
		"metrics_addr.yaml":                     `metrics.addr: must be host:port, got "9090"`,
		"metrics_tenant_series.yaml":            "metrics.tenant_series: must be between 0 (off) and 1000, got 5000",
		"kb_memory_too_small.yaml":              "retrieval.kb_memory_bytes: must be at least 1048576 (1 MiB), got 65536",
		"ban_zero_threshold.yaml":               "limits.ban.threshold: must be > 0, got 0",
		"ban_subsecond_window.yaml":             "limits.ban.window: must be at least 1s, got 500ms",
		"ban_bad_exempt.yaml":                   `limits.ban.exempt[1]: must be a network such as 10.0.0.0/8, got "10.0.0.1"`,
		"bad_encoding.yaml":                     `routing.encoding: must be cl100k_base or o200k_base, got "gpt2"`,
		"threshold_above_short_limit.yaml":      "routing.short_threshold_tokens: must not exceed pools.short.max_prompt_tokens (512)",
		"unknown_tier.yaml":                     `auth.api_keys[0].tier: names unknown tier "gold"`,
		"tier_negative_max_concurrent.yaml":     "limits.tiers.free.max_concurrent: must be >= 0 (0 = no cap), got -1",
		"tier_unknown_class.yaml":               "limits.tiers.free.classes.batch: unknown class (want one of priority, default, flex)",
		"tier_default_class_not_granted.yaml":   `limits.tiers.free.default_class: names class "default", which limits.tiers.free.classes does not grant`,
		"tier_class_zero_weight.yaml":           "limits.tiers.vip.classes.priority.weight: must be > 0, got 0",
		"embedding_openai_no_endpoint.yaml":     `embedding.endpoint: must be an http(s) URL, got ""`,
		"embedding_unknown_provider.yaml":       `embedding.provider: must be local or openai, got "cohere"`,
		"embedding_local_other_model.yaml":      `embedding.model: must be local-hash-v1 with embedding.provider local, got "text-embedding-3-small"`,
		"rerank_http_no_model.yaml":             "rerank.model: must name the model the server runs",
		"rerank_unknown_provider.yaml":          `rerank.provider: must be lexical or http, got "cohere"`,
		"healing_step_back_inside_window.yaml":  "healing.healthy_polls: healthy_polls × interval (15s) must be at least healing.window (30s)",
		"healing_cooldown_below_window.yaml":    "healing.cooldown: must be at least healing.window (1m0s), got 30s",
		"answer_cache_duplicate_kb.yaml":        `answer_cache.kbs[1]: must be a knowledge base named once, got "sluice-docs"`,
		"answer_cache_unshared_kb.yaml":         `answer_cache.kbs[0]: names "docs", which is not a shared knowledge base of retrieval.knowledge_bases; name a tenant's own as <tenant>/docs`,
		"kb_no_owner.yaml":                      "retrieval.knowledge_bases[0]: set exactly one of shared: true or tenant",
		"kb_tenant_takes_shared_name.yaml":      `retrieval.knowledge_bases[1].name: "sluice-docs" is a shared knowledge base's name`,
		"kb_bad_name.yaml":                      `retrieval.knowledge_bases[0].name: must be 1-64 letters, digits, '-', '_' or '.', got "my docs"`,
		"default_kb_not_shared.yaml":            `retrieval.default_kb: names "handbook", which is not shared`,
		"healing_critical_below_warn.yaml":      "healing.critical_ratio: must be at least healing.warn_ratio (3), got 2",
		"healing_window_too_long.yaml":          "healing.window: must not exceed metrics.latency_retention (5m0s), got 10m0s",
		"healing_cost_factor.yaml":              "healing.long_cost_factor: must be between 1 and 10, got 0.5",
		"admission_output_token_weight.yaml":    "admission.output_token_weight: must be above 0 and at most 16, got 0",
		"admission_preemption_min_tokens.yaml":  "admission.preemption.min_tokens: must be at least 1 (a stream paused before its first token only pays a prefill), got 0",
		"admission_preemption_max_pauses.yaml":  "admission.preemption.max_pauses: must be at least 1 (set enabled: false to pause none), got -1",
		"healing_unknown_stage.yaml":            `healing.stage: must be one of embed, answer_cache, admission, retrieval, rerank, llm_first_token, llm, ttft, got "llm_total"`,
		"healing_bad_webhook.yaml":              `healing.alert_webhook: must be an http(s) URL, got "hooks.example.com"`,
		"pools_shared_pool_above_budget.yaml":   "pools.short.max_concurrency: must not exceed pools.shared.max_concurrency (8): the pools share their servers, got 16",
		"pools_partly_shared.yaml":              "pools.long.endpoints: share some but not all servers with pools.short.endpoints",
		"pools_shared_negative.yaml":            "pools.shared.max_concurrency: must not be negative, got -1",
		"pool_fallback_self.yaml":               "pools.short.fallbacks[0].pool: must name another pool than short itself",
		"pool_fallback_unknown_pool.yaml":       `pools.short.fallbacks[0].pool: must be short or long, got "medium"`,
		"pool_fallback_both.yaml":               "pools.long.fallbacks[0]: must set exactly one of model (another model on this pool's endpoints) or pool (another pool)",
		"pool_fallback_same_model.yaml":         `pools.short.fallbacks[0].model: must differ from pools.short.model ("sluice-sim"): a fallback to the same model is a retry`,
		"pool_fallback_twice.yaml":              "pools.short.fallbacks[1]: is listed twice",
		"pool_fallback_cycle.yaml":              "pools.long.fallbacks[0].pool: makes a cycle: pools.short falls back to long already",
		"healing_min_permits.yaml":              "pools.long.healing.min_permits: must be between 1 and pools.long.max_concurrency (12), got 13",
		"healing_min_batch.yaml":                "pools.short.healing.min_batch: must be between 1 and pools.short.healing.base_batch (8), got 16",
		"scaler_unknown_kind.yaml":              `pools.short.scaler.kind: must be none, simulator, webhook or kubernetes, got "hpa"`,
		"scaler_max_below_base.yaml":            "pools.short.scaler.max_replicas: must be at least pools.short.scaler.base_replicas (2), got 1",
		"scaler_simulator_no_url.yaml":          `pools.long.scaler.url: must be an http(s) URL, got ""`,
		"scaler_kubernetes_no_name.yaml":        "pools.short.scaler.deployment: must not be empty",
		"pool_connect_timeout_zero.yaml":        "pools.short.connect_timeout: must be a positive duration such as 30s, got 0s",
		"pool_connect_above_first_token.yaml":   "pools.long.connect_timeout: must be below pools.long.first_token_timeout (5s), got 10s",
		"pool_first_token_timeout_zero.yaml":    "pools.short.first_token_timeout: must be a positive duration such as 30s, got 0s",
		"pool_token_idle_negative.yaml":         "pools.long.token_idle_timeout: must be a positive duration such as 30s, got -1s",
		"breaker_zero_failures.yaml":            "pools.short.breaker.failures: must be > 0, got 0",
		"pool_continuation_unknown.yaml":        `pools.short.continuation: must be none or vllm, got "tgi"`,
		"pool_priority_unknown.yaml":            `pools.long.priority: must be none or vllm, got "sglang"`,
		"pool_max_failovers_zero.yaml":          "pools.long.max_failovers: must be > 0, got 0",
		"breaker_open_for_zero.yaml":            "pools.short.breaker.open_for: must be a positive duration such as 30s, got 0s",
		"breaker_slow_above_first_token.yaml":   "pools.long.breaker.slow_first_token: must be below pools.long.first_token_timeout (30s), got 45s",
		"api_negative_drain_delay.yaml":         "api.drain_delay: must be >= 0, got -1s",
		"temporal_stop_timeout_zero.yaml":       "temporal.worker_stop_timeout: must be a positive duration such as 30s, got 0s",
		"temporal_workflow_cache_negative.yaml": "temporal.workflow_cache_size: must be >= 0 (0: derived from the pools), got -1",
		"api_zero_stream_write_timeout.yaml":    "api.stream_write_timeout: must be a positive duration such as 30s, got 0s",
		"api_per_ip_above_total.yaml":           "api.max_conns_per_ip: must not exceed api.max_conns (100), got 200",
		"api_trusted_proxy_not_network.yaml":    `api.trusted_proxies[1]: must be a network such as 10.0.0.0/8, got "192.168.1.7"`,
		"api_proxy_share_whole.yaml":            "api.proxy_conns_share: must be above 0 and below 1 (one proxy must leave the process room for the others), got 1",
		"api_idempotency_above_events.yaml":     "api.idempotency_ttl: must not exceed events.ttl (30m0s), got 2h0m0s",
		"route_rate_negative.yaml":              "limits.tiers.free.routes.reads: rates must be >= 0 (0 = no limit), got {TenantPerMinute:-1 IPPerMinute:0}",
		"redis_addr_and_url.yaml":               "redis.url: set only one of redis.addr, redis.addrs, redis.url and redis.sentinel; redis.addr is set too",
		"redis_cluster_db.yaml":                 "redis.db: must be 0 with a Redis Cluster (redis.addrs, or a redis.url with ?addr=), which has only database 0, got 2",
		"redis_url_bad_scheme.yaml":             `redis.url: must be a redis:// or rediss:// URL, got "http://sluice:xxxxx@redis.example.com:6379"`,
		"redis_url_query.yaml":                  `redis.url: query parameter "pool_size" is not supported (only addr, a cluster seed; timeouts and pools come from redis.timeout)`,
		"redis_url_user_twice.yaml":             "redis.username: must not be set when redis.url carries a user",
		"redis_url_db_twice.yaml":               "redis.db: must not be set when redis.url selects a database (/1)",
		"redis_url_cluster_db.yaml":             "redis.url: must select database 0 (or none) with ?addr= seeds: a Redis Cluster has only database 0, got /3",
		"redis_sentinel_no_addrs.yaml":          `redis.sentinel.addrs: must list the sentinels (host:port) that watch "mymaster"`,
		"redis_sentinel_no_master.yaml":         "redis.sentinel.master_name: must name the primary that the sentinels watch",
		"redis_addrs_no_port.yaml":              `redis.addrs[0]: must be host:port, got "redis-0"`,
		"redis_tls_cert_no_key.yaml":            "redis.tls.key_file: must be set with redis.tls.cert_file (a client certificate needs its key)",
		"redis_tls_plain_url.yaml":              "redis.tls: settings are given, but redis.url is redis://, without TLS; use rediss://",
		"redis_tls_disabled_rediss.yaml":        "redis.tls.enabled: is false, but redis.url is rediss://; the scheme says whether to use TLS",
		"temporal_tls_disabled_with_ca.yaml":    "temporal.tls.enabled: is false, but other temporal.tls settings are given; remove them or the false",
		"temporal_tls_key_no_cert.yaml":         "temporal.tls.cert_file: must be set with temporal.tls.key_file (a client key needs its certificate)",
		"codec_no_keys.yaml":                    "codec.keys: must list at least one key when codec.enabled is true",
		"codec_key_variable_unset.yaml":         "codec.keys[0]: variable SLUICE_CODEC_KEY_NOPE is not set",
		"codec_key_file_and_env.yaml":           "codec.keys[0]: set exactly one of file and env",
		"codec_key_short.yaml":                  "codec.keys[0]: must be 32 bytes (AES-256) in base64 (openssl rand -base64 32), got 16 bytes",
		"codec_unknown_active_key.yaml":         `codec.active_key: must name one of codec.keys, got "k2"`,
		"codec_duplicate_key_id.yaml":           `codec.keys[1].id: duplicate key id "k1"`,
		"codec_bad_ui_origin.yaml":              `codec.ui_origins[0]: must be an http(s) URL, got "temporal.example.com"`,
		"codec_ui_origin_with_path.yaml":        `codec.ui_origins[0]: must be an origin (scheme://host[:port], no path), got "https://temporal.example.com/"`,
		"privacy_short_ip_hash_key.yaml":        "privacy.ip_hash_key: must be at least 16 characters (openssl rand -base64 32), got 5",
		"usage_unknown_store.yaml":              `usage.store: must be off, sqlite or postgres, got "mysql"`,
		"usage_sqlite_no_path.yaml":             "usage.sqlite_path: must not be empty",
		"usage_postgres_bad_dsn.yaml":           "usage.postgres_dsn: must be a postgres:// URL or libpq key=value pairs naming a host (store postgres)",
		"usage_path_store_off.yaml":             `usage.sqlite_path: is for usage.store sqlite, got store "off"`,
		"responses_sqlite_no_path.yaml":         "responses.sqlite_path: must not be empty",
		"responses_zero_max_chain.yaml":         "responses.max_chain: must be > 0, got 0",
		"responses_zero_background_wait.yaml":   "responses.background_max_wait: must be a positive duration such as 30s, got 0s",
		"budget_negative_tokens.yaml":           "limits.tiers.free.budget.tokens_per_month: must be >= 0 (0 = no limit), got -1",
		"budget_spend_without_price.yaml":       `limits.tiers.free.budget.spend_per_month_usd: needs a price for model "sluice-sim" (pools.short.model) in prices`,
		"budget_without_ledger.yaml":            `limits.tiers.free.budget: needs usage.store (the ledger a lost counter is rebuilt from), got store "off"`,
		"price_negative.yaml":                   "prices.sluice-sim: prices must be finite and >= 0",
	}
	files, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Fatalf("%d fixtures, %d expectations", len(files), len(want))
	}
	for _, f := range files {
		msg, ok := want[filepath.Base(f)]
		if !ok {
			t.Errorf("fixture %s has no expected message", f)
			continue
		}
		_, err := Load(f, nil)
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: error %v, want it to contain %q", filepath.Base(f), err, msg)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: error shows a password: %v", filepath.Base(f), err)
		}
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
	if err == nil || !os.IsNotExist(unwrapAll(err)) {
		t.Fatalf("missing file: %v", err)
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

// Two tenants may each configure a kb of one name; each is its own.
func TestTenantsConfigureKBsOfOneName(t *testing.T) {
	cfg := Default()
	cfg.Retrieval.KnowledgeBases = append(cfg.Retrieval.KnowledgeBases,
		KnowledgeBase{Name: "docs", Tenant: "acme", Dir: "/srv/acme"},
		KnowledgeBase{Name: "docs", Tenant: "globex", Dir: "/srv/globex"})
	cfg.AnswerCache.KBs = []string{"sluice-docs", "acme/docs"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if a, g := cfg.Retrieval.KnowledgeBases[1].key(), cfg.Retrieval.KnowledgeBases[2].key(); a == g || a == "docs" {
		t.Fatalf("acme's %v and globex's %v", a, g)
	}
	cfg.Retrieval.KnowledgeBases = append(cfg.Retrieval.KnowledgeBases, KnowledgeBase{Name: "docs", Tenant: "acme", Dir: "/srv/other"})
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `retrieval.knowledge_bases[3].name: duplicate knowledge base "docs"`) {
		t.Fatalf("acme's second docs: %v", err)
	}
}

// The variables clients use live in the shells that start servers: they
// are not settings, and an empty Temporal profile file (what make run
// points the stack at) leaves the defaults in force.
func TestClientVariablesAreNotSettings(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "temporal.toml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load("", []string{"SLUICE_KEY=sk-demo", "SLUICE_URL=http://127.0.0.1:8080", "SLUICE_ADMIN_KEY=root",
		"TEMPORAL_CONFIG_FILE=" + empty, "SLUICE_TEMPORAL_HOST_PORT=127.0.0.1:7233"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Temporal.HostPort != "127.0.0.1:7233" || cfg.Temporal.Namespace != "default" || cfg.Temporal.UsesTLS() {
		t.Fatalf("temporal %+v", cfg.Temporal)
	}
}

func TestPoolsShareBackends(t *testing.T) {
	p := Default().Pools
	if !p.SharesBackends() || p.SharedLimit() != 16 {
		t.Fatalf("default pools: shares %v, limit %d; want one simulator, 16", p.SharesBackends(), p.SharedLimit())
	}
	p.Long.Endpoints = []string{"http://127.0.0.1:8090/v1/"}
	if !p.SharesBackends() {
		t.Error("a trailing /v1/ made the same server another")
	}
	p.Shared.MaxConcurrency = 0
	if got := p.SharedLimit(); got != 16 {
		t.Errorf("unset shared budget is %d, want the larger pool's 16", got)
	}
	p.Long.Model = "other"
	if p.SharesBackends() || p.SharedLimit() != 0 {
		t.Error("pools of different models on one URL share a budget")
	}
	p.Long.Model = p.Short.Model
	p.Long.Endpoints = []string{"http://127.0.0.1:8091"}
	if p.SharesBackends() {
		t.Error("pools on different servers share a budget")
	}
}

// A waiter may have a stream paused for it when a pool whose streams
// would give it their permit continues answers: its own, or either of
// pools sharing their budget.
func TestPoolsPausesFor(t *testing.T) {
	p := Default().Pools
	p.Long.Continuation = ContinuationVLLM
	if !p.PausesFor(request.PoolShort) || !p.PausesFor(request.PoolLong) {
		t.Errorf("pools sharing their budget: short %v, long %v; want both", p.PausesFor(request.PoolShort), p.PausesFor(request.PoolLong))
	}
	p.Long.Endpoints = []string{"http://127.0.0.1:8091"}
	if p.PausesFor(request.PoolShort) || !p.PausesFor(request.PoolLong) {
		t.Errorf("pools apart: short %v, long %v; want long only", p.PausesFor(request.PoolShort), p.PausesFor(request.PoolLong))
	}
	p.Long.Continuation = ""
	if p.PausesFor(request.PoolLong) {
		t.Error("a pool that does not continue answers pauses")
	}
}

// A pool's fallbacks load in order, both kinds.
func TestPoolFallbacksLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	yaml := "pools:\n  short:\n    fallbacks:\n      - model: sluice-sim-small\n      - pool: long\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Fallback{{Model: "sluice-sim-small"}, {Pool: "long"}}
	if !slices.Equal(cfg.Pools.Short.Fallbacks, want) || len(cfg.Pools.Long.Fallbacks) != 0 {
		t.Fatalf("fallbacks %+v / %+v, want %+v / none", cfg.Pools.Short.Fallbacks, cfg.Pools.Long.Fallbacks, want)
	}
}
