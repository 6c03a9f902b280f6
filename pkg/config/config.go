// Package config loads Sluice's one YAML configuration file, applies
// SLUICE_* environment overrides and validates the result before anything
// starts, so that a bad value fails fast with the name of the field.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is the whole of Sluice's configuration. Every field has a default
// (see Default); a file only needs the values it changes.
type Config struct {
	API       API       `yaml:"api"`
	Temporal  Temporal  `yaml:"temporal"`
	Redis     Redis     `yaml:"redis"`
	Events    Events    `yaml:"events"`
	Admission Admission `yaml:"admission"`
	Pools     Pools     `yaml:"pools"`
	Routing   Routing   `yaml:"routing"`
	LLM       LLM       `yaml:"llm"`
	Embedding Embedding `yaml:"embedding"`
	Rerank    Rerank    `yaml:"rerank"`
	Retrieval Retrieval `yaml:"retrieval"`
	Ingest    Ingest    `yaml:"ingest"`
	Sessions  Sessions  `yaml:"sessions"`
	Metrics   Metrics   `yaml:"metrics"`
	// Healing is the tail-latency healer (one workflow per deployment).
	Healing Healing `yaml:"healing"`
	// AnswerCache is the L3 tier: whole answers (off unless kbs are listed).
	AnswerCache AnswerCache `yaml:"answer_cache"`
	Auth        Auth        `yaml:"auth"`
	Limits      Limits      `yaml:"limits"`
	Log         Log         `yaml:"log"`
}

// Limits are the per-tier traffic rules: token-bucket rate limits at the
// door and the tier's share of the admission queue.
type Limits struct {
	// Enabled turns the rate limits at the door on; tier weights, waits
	// and queue caps apply either way.
	Enabled bool `yaml:"enabled"`
	// DefaultTier is the tier of callers whose API key names none, and of
	// anonymous callers.
	DefaultTier string `yaml:"default_tier"`
	// Tiers by name (e.g. free, standard, vip).
	Tiers map[string]Tier `yaml:"tiers"`
}

// Tier is one service level.
type Tier struct {
	// Weight is the tier's share in weighted fair queuing: with weights
	// 5:3:2 and all backlogged, tenants are served 50/30/20.
	Weight int `yaml:"weight" json:"weight"`
	// MaxWait bounds a queued request's wait; 0 uses admission.max_wait.
	MaxWait time.Duration `yaml:"max_wait" json:"-"`
	// MaxQueuePerTenant caps one tenant's waiting requests per pool; 0 is
	// no cap beyond admission.max_queue_depth.
	MaxQueuePerTenant int `yaml:"max_queue_per_tenant" json:"max_queue_per_tenant"`
	// MaxOutputTokens caps a request's max_tokens; 0 uses
	// api.max_tokens_limit.
	MaxOutputTokens int `yaml:"max_output_tokens" json:"max_output_tokens"`
	// Rate limits by dimension; a zero Rate is no limit.
	Tenant Rate `yaml:"tenant" json:"tenant"`
	User   Rate `yaml:"user" json:"user"`
	IP     Rate `yaml:"ip" json:"ip"`
}

// Rate is a token bucket in tokens (TPM-style), in requests (RPM-style), or
// both. Bursts default to one minute's worth.
type Rate struct {
	TokensPerMinute   float64 `yaml:"tokens_per_minute" json:"tokens_per_minute,omitempty"`
	TokenBurst        float64 `yaml:"token_burst" json:"token_burst,omitempty"`
	RequestsPerMinute float64 `yaml:"requests_per_minute" json:"requests_per_minute,omitempty"`
	RequestBurst      float64 `yaml:"request_burst" json:"request_burst,omitempty"`
}

// API configures the Echo HTTP front door.
type API struct {
	// Addr is the listen address of the HTTP API.
	Addr string `yaml:"addr"`
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxQueryChars bounds the query text; longer queries get 413.
	MaxQueryChars int `yaml:"max_query_chars"`
	// DefaultMaxTokens is the output budget of a request that names none.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// MaxTokensLimit is the largest max_tokens a request may ask for.
	MaxTokensLimit int `yaml:"max_tokens_limit"`
	// EmbeddedWorker runs a Temporal worker inside the API process so that
	// eager workflow start can hand the first workflow task to it directly.
	EmbeddedWorker bool `yaml:"embedded_worker"`
	// StreamIdleTimeout ends an SSE stream that has seen no event for this
	// long (the workflow is presumably gone); it is not a request deadline.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// ShutdownTimeout bounds graceful shutdown of open streams.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// DisconnectGrace is how long a request whose client went away waits
	// for it to reconnect (GET /v1/requests/:id/events with Last-Event-ID)
	// before it cancels itself; 0 cancels at once.
	DisconnectGrace time.Duration `yaml:"disconnect_grace"`
	// QueuePollInterval is how often an SSE stream of a queued request
	// re-reads its position to send queue events.
	QueuePollInterval time.Duration `yaml:"queue_poll_interval"`
	// MaxStartsInFlight bounds the workflow starts one API process has
	// outstanding; beyond it requests get 503 + Retry-After at once rather
	// than piling onto a Temporal server that starts only so many
	// workflows a second.
	MaxStartsInFlight int `yaml:"max_starts_in_flight"`
	// TrustForwardedFor takes the client IP (for per-IP limits) from
	// X-Forwarded-For, as set by a trusted proxy in front; off, it is the
	// connection's address, which a client cannot forge.
	TrustForwardedFor bool `yaml:"trust_forwarded_for"`
}

// Temporal says where the Temporal frontend is and how workflows are started.
type Temporal struct {
	HostPort  string `yaml:"host_port"`
	Namespace string `yaml:"namespace"`
	// TaskQueue carries chat workflows and their activities.
	TaskQueue string `yaml:"task_queue"`
	// EagerStart asks the server to hand the first workflow task to the
	// starting process's own worker (needs system.enableEagerWorkflowStart).
	EagerStart bool `yaml:"eager_start"`
	// SearchAttributes enables upserting Sluice's custom search attributes;
	// the server must have them registered (make run and the tests do).
	SearchAttributes bool `yaml:"search_attributes"`
	// MaxConcurrentActivities bounds regular activities (LLM streams) per worker.
	MaxConcurrentActivities int `yaml:"max_concurrent_activities"`
	// MaxConcurrentWorkflowTasks bounds workflow tasks per worker.
	MaxConcurrentWorkflowTasks int `yaml:"max_concurrent_workflow_tasks"`
}

// Redis is the one Redis that holds permits, queues, caches and event streams.
type Redis struct {
	Addr     string `yaml:"addr"`
	Password string `yaml:"password"`
	DB       int    `yaml:"db"`
	// KeyPrefix namespaces every key Sluice writes, so that several
	// deployments (or tests) can share one Redis.
	KeyPrefix string `yaml:"key_prefix"`
}

// Events configures the per-request Redis Streams that carry SSE events.
type Events struct {
	// TTL is how long a request's event stream stays readable after its last
	// event, so that a client can reconnect with Last-Event-ID.
	TTL time.Duration `yaml:"ttl"`
	// MaxLen caps the entries of one stream (approximate trimming).
	MaxLen int64 `yaml:"max_len"`
}

// Admission configures the concurrency gate in front of the LLM pools.
type Admission struct {
	// MaxWait bounds how long a request waits in the queue.
	MaxWait time.Duration `yaml:"max_wait"`
	// Lease is how long a permit lives without renewal; a crashed holder's
	// permit comes back after at most this long.
	Lease time.Duration `yaml:"lease"`
	// RecheckInterval is the workflow's fallback re-check of its queue entry,
	// in case a hand-off signal was lost. Workflow timers under 1 s are not
	// precise, so keep it at 1 s or more.
	RecheckInterval time.Duration `yaml:"recheck_interval"`
	// MaxRecheckInterval is the longest a waiter far back in the queue goes
	// between re-checks: each re-check is a timer, a workflow task and a
	// Redis call, so 10,000 waiters checking every RecheckInterval would
	// flood Temporal. A waiter's cadence grows with its position and
	// expected wait (admission.RecheckAfter), and its queue place stays
	// live that long (three cadences), so a waiter that vanished without
	// releasing (a terminated workflow) is dropped after at most that.
	MaxRecheckInterval time.Duration `yaml:"max_recheck_interval"`
	// FastWait is how long a request whose turn is near (no more waiters
	// ahead of it than the pool has permits) waits for its grant inside
	// its admission activity, woken over Redis pub/sub in about a
	// millisecond rather than by a Temporal signal; then it parks as
	// usual. A cancel reaches such a request after at most this long.
	// 0 turns it off; under 4s (a local activity's time limit is 5s).
	FastWait time.Duration `yaml:"fast_wait"`
	// MaxQueueDepth bounds the waiting queue of each pool.
	MaxQueueDepth int `yaml:"max_queue_depth"`
}

// Pools holds the two LLM pools requests are routed to by prompt length.
type Pools struct {
	Short Pool `yaml:"short"`
	Long  Pool `yaml:"long"`
}

// Pool is one OpenAI-compatible LLM endpoint list with its own permits.
type Pool struct {
	// Endpoints are base URLs of OpenAI-compatible servers (".../v1" is added
	// when missing); requests are spread round-robin.
	Endpoints []string `yaml:"endpoints"`
	// Model is sent as "model" in the chat completion request.
	Model string `yaml:"model"`
	// APIKey, if set, is sent as a bearer token.
	APIKey string `yaml:"api_key"`
	// MaxConcurrency is the number of permits: streams in flight at once.
	MaxConcurrency int `yaml:"max_concurrency"`
	// MaxPromptTokens is the hard limit of a prompt sent to this pool.
	MaxPromptTokens int `yaml:"max_prompt_tokens"`
	// MaxWait bounds a request's wait in this pool's queue (0: the
	// admission.max_wait). A tier's max_wait still wins: it is what the
	// customer was promised. Long answers hold permits longer, so the long
	// pool's queue moves slower and may warrant a longer wait.
	MaxWait time.Duration `yaml:"max_wait"`
	// Healing bounds what the healer may do to this pool's permits and
	// batch; Scaler is how it asks for more replicas.
	Healing PoolHealing `yaml:"healing"`
	Scaler  Scaler      `yaml:"scaler"`
}

// PoolHealing bounds the healer's shrinking of a pool.
type PoolHealing struct {
	// MinPermits is the fewest permits shrinking leaves (it halves
	// max_concurrency).
	MinPermits int `yaml:"min_permits"`
	// BaseBatch is the backends' max_num_seqs, which shrinking halves
	// through their admin API (llmsim's POST /admin/config); 0: the batch
	// is not tuned, the permits are the only batch control (vLLM and TGI
	// cannot change it at run time).
	BaseBatch int `yaml:"base_batch"`
	// MinBatch is the smallest max_num_seqs shrinking sets.
	MinBatch int `yaml:"min_batch"`
}

// Scaler kinds.
const (
	ScalerNone       = "none"
	ScalerSimulator  = "simulator"
	ScalerWebhook    = "webhook"
	ScalerKubernetes = "kubernetes"
)

// Scaler is how the healer asks a pool for more replicas (pkg/scaler).
type Scaler struct {
	// Kind is none (the healer never scales the pool), simulator (llmsim's
	// POST /admin/config), webhook (POST {pool, replicas, reason} to URL)
	// or kubernetes (a Deployment's scale subresource).
	Kind string `yaml:"kind"`
	// URL is the simulator's base URL or the webhook's.
	URL string `yaml:"url"`
	// StatusURL (webhook) answers GET with {"replicas": N}; optional.
	StatusURL string `yaml:"status_url"`
	// Token (webhook) is sent as a bearer token.
	Token string `yaml:"token"`
	// APIServer, Namespace and Deployment (kubernetes) name the
	// Deployment; the API server and namespace default to the pod's own.
	APIServer  string `yaml:"api_server"`
	Namespace  string `yaml:"namespace"`
	Deployment string `yaml:"deployment"`
	// BaseReplicas is the pool's normal count, which the healer returns
	// to; MaxReplicas is the most it ever asks for.
	BaseReplicas int `yaml:"base_replicas"`
	MaxReplicas  int `yaml:"max_replicas"`
	// Timeout bounds one call to the scale target.
	Timeout time.Duration `yaml:"timeout"`
}

// HealingStages are the latency series the healer can watch: each stage
// a request reports, and "ttft", the sum of the stages up to its first
// token (the admission queue included).
func HealingStages() []string {
	return []string{"embed", "answer_cache", "admission", "retrieval", "rerank", "llm_first_token", "llm", "ttft"}
}

// MaxLongCostFactor bounds how much more a long request may be charged
// against token rate limits while the healer throttles long requests.
const MaxLongCostFactor = 10

// Healing configures the tail-latency healer (seed 002): every Interval
// it reads each pool's P99/P50 of Stage over Window, its queue, timeout
// rate and backend KV-cache use, warns above the warn thresholds and,
// above the critical ones, escalates per pool: shrink the batch, throttle
// long requests, scale out, shed the lowest tier's waiters; it steps back
// after HealthyPolls healthy polls in a row.
type Healing struct {
	// Enabled starts the healing workflow with the worker.
	Enabled bool `yaml:"enabled"`
	// Interval between polls; Window is how far back each poll looks (at
	// most metrics.latency_retention).
	Interval time.Duration `yaml:"interval"`
	Window   time.Duration `yaml:"window"`
	// Stage is the stage whose P99/P50 is watched (HealingStages).
	Stage string `yaml:"stage"`
	// WarnRatio and CriticalRatio are P99/P50 thresholds.
	WarnRatio     float64 `yaml:"warn_ratio"`
	CriticalRatio float64 `yaml:"critical_ratio"`
	// WarnKVCache is the backend KV-cache use (0..1) that warns.
	WarnKVCache float64 `yaml:"warn_kv_cache"`
	// CriticalQueueDepth and CriticalTimeoutRate (queue timeouts per
	// request) are critical too.
	CriticalQueueDepth  int     `yaml:"critical_queue_depth"`
	CriticalTimeoutRate float64 `yaml:"critical_timeout_rate"`
	// CriticalP99 makes a P99 of the watched stage above it critical
	// whatever P99/P50 says (0: off): when overload collapses a pool, P50
	// grows too and the ratio understates the tail (bench-heal shows it).
	CriticalP99 time.Duration `yaml:"critical_p99"`
	// MinSamples: fewer latencies in the window and the ratio is ignored.
	MinSamples int64 `yaml:"min_samples"`
	// HealthyPolls in a row step a pool back a level; Cooldown is the
	// least time between two level changes of a pool.
	HealthyPolls int           `yaml:"healthy_polls"`
	Cooldown     time.Duration `yaml:"cooldown"`
	// LongCostFactor is how hard throttling bears on long requests: they
	// are charged this multiple of their tokens against token rate
	// limits, and the long pool's permits are divided by it.
	LongCostFactor float64 `yaml:"long_cost_factor"`
	// PollsPerRun bounds one workflow run's history (then continue-as-new).
	PollsPerRun int `yaml:"polls_per_run"`
	// AlertWebhook receives a JSON POST for every alert ("": none);
	// AlertTimeout bounds it.
	AlertWebhook string        `yaml:"alert_webhook"`
	AlertTimeout time.Duration `yaml:"alert_timeout"`
	// MetricsTimeout bounds reading a backend's /metrics.
	MetricsTimeout time.Duration `yaml:"metrics_timeout"`
}

// Routing chooses a pool by the prompt's token count.
type Routing struct {
	// ShortThresholdTokens: prompts with at most this many tokens go short.
	ShortThresholdTokens int `yaml:"short_threshold_tokens"`
	// Encoding is the tiktoken encoding used to count tokens.
	Encoding string `yaml:"encoding"`
}

// LLM configures the streaming LLM call.
type LLM struct {
	SystemPrompt string `yaml:"system_prompt"`
	// Timeout bounds one whole streamed completion.
	Timeout time.Duration `yaml:"timeout"`
	// HeartbeatTimeout: a stream that stops heartbeating this long is
	// presumed lost and retried (only if no token was sent yet).
	HeartbeatTimeout time.Duration `yaml:"heartbeat_timeout"`
	// MaxAttempts bounds retries of an LLM call that failed before its
	// first token.
	MaxAttempts int `yaml:"max_attempts"`
	// TruncationNotice ends an answer cut at its max_tokens, so that the
	// reader is told instead of left with a sentence that stops mid-word
	// (empty: no notice).
	TruncationNotice string `yaml:"truncation_notice"`
}

// Embedding providers.
const (
	// EmbeddingLocal is the built-in hashed n-gram embedder: no server,
	// lexical similarity only.
	EmbeddingLocal = "local"
	// EmbeddingOpenAI is a server speaking OpenAI's POST /v1/embeddings
	// (OpenAI, vLLM, TEI, Ollama, LiteLLM...).
	EmbeddingOpenAI = "openai"
)

// Embedding configures the embedder of queries and documents, and the
// query embedding cache.
type Embedding struct {
	// Provider is EmbeddingLocal or EmbeddingOpenAI.
	Provider string `yaml:"provider"`
	// Model names the model: local-hash-v1 for the local provider; for
	// openai it is sent as "model". Model and Dims are part of every cache
	// key and of the kb store's model check, so changing either retires the
	// cached embeddings and retrievals and requires re-ingesting the kbs.
	Model string `yaml:"model"`
	// Dims is the vector length; 0 is the embedder's own (256 for local,
	// the model's for openai). For openai a positive value is sent as
	// "dimensions", which only some models accept (text-embedding-3
	// shortens its vectors; most others reject the field).
	Dims int `yaml:"dims"`
	// Endpoint is the openai server's base URL, without "/v1".
	Endpoint string `yaml:"endpoint"`
	// APIKey, if set, is sent to the openai server as a bearer token.
	APIKey string `yaml:"api_key"`
	// Timeout bounds one request to the openai server.
	Timeout time.Duration `yaml:"timeout"`
	// CacheTTL is the Redis TTL of a cached query embedding.
	CacheTTL time.Duration `yaml:"cache_ttl"`
	// LRUSize is the in-process cache size in entries.
	LRUSize int `yaml:"lru_size"`
}

// Rerank providers.
const (
	// RerankLexical is the built-in reranker: BM25 over the candidates,
	// fused with the retrieval score.
	RerankLexical = "lexical"
	// RerankHTTP is a cross-encoder behind the rerank API of Hugging Face
	// Text Embeddings Inference (POST /rerank).
	RerankHTTP = "http"
)

// Rerank configures the reranker that cuts retrieval's candidates to
// retrieval.top_k.
type Rerank struct {
	// Provider is RerankLexical or RerankHTTP.
	Provider string `yaml:"provider"`
	// Endpoint is the http server's base URL; requests go to
	// Endpoint + "/rerank".
	Endpoint string `yaml:"endpoint"`
	// Model names the model the http server runs. TEI serves one model per
	// server, so it is not sent, but it versions the reranker.
	Model string `yaml:"model"`
	// APIKey, if set, is sent to the http server as a bearer token.
	APIKey string `yaml:"api_key"`
	// Timeout bounds one rerank call to the http server, all batches
	// together.
	Timeout time.Duration `yaml:"timeout"`
	// MaxBatch is the most candidates per request to the http server
	// (TEI's max_client_batch_size); more are sent in several requests.
	MaxBatch int `yaml:"max_batch"`
}

// Retrieval configures knowledge-base search.
type Retrieval struct {
	// TopK chunks go into the prompt after rerank.
	TopK int `yaml:"top_k"`
	// Candidates are fetched by retrieval and cut to TopK by rerank.
	Candidates int `yaml:"candidates"`
	// CacheTTL is the Redis TTL of a cached retrieval result.
	CacheTTL time.Duration `yaml:"cache_ttl"`
	// KnowledgeBases are the kbs a request may name.
	KnowledgeBases []KnowledgeBase `yaml:"knowledge_bases"`
	// DefaultKB is used when a request names none.
	DefaultKB string `yaml:"default_kb"`
	// ChunkTokens bounds one chunk; used to estimate prompt size before
	// retrieval has run.
	ChunkTokens int `yaml:"chunk_tokens"`
	// ChunkOverlapTokens is how much of a chunk's end the next one repeats
	// when a break falls inside a paragraph (0: none).
	ChunkOverlapTokens int `yaml:"chunk_overlap_tokens"`
}

// Ingest bounds document ingestion (POST /v1/kb/:kb/documents), which
// chunks and embeds and so is expensive too: it holds one of
// MaxConcurrent leased permits shared by every API instance.
type Ingest struct {
	MaxConcurrent int `yaml:"max_concurrent"`
	// MaxWait is how long a request waits for a permit before 503.
	MaxWait time.Duration `yaml:"max_wait"`
	// Lease is a permit's lease, renewed while the ingestion runs.
	Lease time.Duration `yaml:"lease"`
	// MaxDocuments bounds one request's batch; MaxBodyBytes its body.
	MaxDocuments int   `yaml:"max_documents"`
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
}

// Metrics configures Prometheus metrics and the latency window that
// instances share.
type Metrics struct {
	// WorkerAddr is where sluice-worker serves GET /metrics ("": not at
	// all); the API serves it on api.addr.
	WorkerAddr string `yaml:"worker_addr"`
	// LatencySlot is the time slot of the shared latency window: a reader
	// sees the last few slots. LatencyRetention is how long slots are kept.
	LatencySlot      time.Duration `yaml:"latency_slot"`
	LatencyRetention time.Duration `yaml:"latency_retention"`
}

// Sessions configures conversation memory (/v1/chat with a session_id).
type Sessions struct {
	// TTL is how long a session outlives its last turn.
	TTL time.Duration `yaml:"ttl"`
	// MaxTurns is how many of its newest turns a session keeps.
	MaxTurns int `yaml:"max_turns"`
	// HistoryTokens bounds the earlier turns put into a prompt; the newest
	// that fit are kept (0: sessions are recorded but not replayed).
	HistoryTokens int `yaml:"history_tokens"`
}

// AnswerCache configures the L3 tier, which serves a repeated question
// its earlier answer without an LLM call. An answer is only right for the
// same kb version, model and prompt, all of which are in its key; still,
// it is off unless a kb is listed, because a kb's owner must agree that
// one answer fits every asker.
type AnswerCache struct {
	// KBs lists the knowledge bases whose answers are cached.
	KBs []string `yaml:"kbs"`
	// TTL is how long an answer is kept.
	TTL time.Duration `yaml:"ttl"`
}

// KnowledgeBase names a corpus. Dir, if set, loads *.md and *.txt files
// from a directory; otherwise Builtin names a corpus compiled into Sluice.
type KnowledgeBase struct {
	Name    string `yaml:"name"`
	Builtin string `yaml:"builtin"`
	Dir     string `yaml:"dir"`
}

// Auth maps API keys to tenants.
type Auth struct {
	// AllowAnonymous lets requests without an API key through as tenant
	// "anonymous" (dev stack only).
	AllowAnonymous bool     `yaml:"allow_anonymous"`
	APIKeys        []APIKey `yaml:"api_keys"`
	// AdminKey guards /v1/admin/*; empty disables those routes.
	AdminKey string `yaml:"admin_key"`
}

// APIKey is one client credential.
type APIKey struct {
	Key    string `yaml:"key"`
	Tenant string `yaml:"tenant"`
	User   string `yaml:"user"`
	Tier   string `yaml:"tier"`
}

// Log configures log/slog output.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// Default returns a configuration that runs the local dev stack.
func Default() Config {
	return Config{
		API: API{
			Addr:              "127.0.0.1:8080",
			MaxBodyBytes:      64 << 10,
			MaxQueryChars:     4000,
			DefaultMaxTokens:  128,
			MaxTokensLimit:    2048,
			EmbeddedWorker:    true,
			StreamIdleTimeout: 2 * time.Minute,
			ShutdownTimeout:   10 * time.Second,
			DisconnectGrace:   5 * time.Second,
			QueuePollInterval: 500 * time.Millisecond,
			MaxStartsInFlight: 64,
		},
		Temporal: Temporal{
			HostPort:                   "127.0.0.1:7233",
			Namespace:                  "default",
			TaskQueue:                  "sluice-chat",
			EagerStart:                 true,
			SearchAttributes:           true,
			MaxConcurrentActivities:    1000,
			MaxConcurrentWorkflowTasks: 100,
		},
		Redis: Redis{Addr: "127.0.0.1:6379", KeyPrefix: "sluice:"},
		Events: Events{
			TTL:    time.Hour,
			MaxLen: 20000,
		},
		Admission: Admission{
			MaxWait:            30 * time.Second,
			Lease:              30 * time.Second,
			RecheckInterval:    2 * time.Second,
			MaxRecheckInterval: 10 * time.Minute,
			FastWait:           time.Second,
			MaxQueueDepth:      10000,
		},
		Pools: Pools{
			Short: Pool{
				Endpoints:       []string{"http://127.0.0.1:8090"},
				Model:           "sluice-sim",
				MaxConcurrency:  16,
				MaxPromptTokens: 512,
				Healing:         PoolHealing{MinPermits: 1, MinBatch: 1},
				Scaler:          Scaler{Kind: ScalerNone, BaseReplicas: 1, Timeout: 10 * time.Second},
			},
			Long: Pool{
				Endpoints:       []string{"http://127.0.0.1:8090"},
				Model:           "sluice-sim",
				MaxConcurrency:  4,
				MaxPromptTokens: 8192,
				Healing:         PoolHealing{MinPermits: 1, MinBatch: 1},
				Scaler:          Scaler{Kind: ScalerNone, BaseReplicas: 1, Timeout: 10 * time.Second},
			},
		},
		Routing: Routing{ShortThresholdTokens: 512, Encoding: "cl100k_base"},
		LLM: LLM{
			SystemPrompt:     "You are a helpful assistant. Answer the question using only the context below. If the context does not contain the answer, say so.",
			Timeout:          5 * time.Minute,
			HeartbeatTimeout: 10 * time.Second,
			MaxAttempts:      3,
			TruncationNotice: " … [answer truncated at the length limit]",
		},
		Embedding: Embedding{
			Provider: EmbeddingLocal,
			Model:    "local-hash-v1",
			Timeout:  10 * time.Second,
			CacheTTL: 24 * time.Hour,
			LRUSize:  10000,
		},
		Rerank: Rerank{
			Provider: RerankLexical,
			Timeout:  5 * time.Second,
			MaxBatch: 32,
		},
		Ingest:   Ingest{MaxConcurrent: 10, MaxWait: 30 * time.Second, Lease: 30 * time.Second, MaxDocuments: 100, MaxBodyBytes: 16 << 20},
		Sessions: Sessions{TTL: 24 * time.Hour, MaxTurns: 20, HistoryTokens: 1024},
		Metrics:  Metrics{WorkerAddr: "127.0.0.1:9091", LatencySlot: 10 * time.Second, LatencyRetention: 5 * time.Minute},
		Healing: Healing{
			Enabled: true, Interval: 10 * time.Second, Window: 30 * time.Second, Stage: "llm_first_token",
			WarnRatio: 2, CriticalRatio: 5, WarnKVCache: 0.75, CriticalQueueDepth: 100, CriticalTimeoutRate: 0.05,
			MinSamples: 50, HealthyPolls: 3, Cooldown: 30 * time.Second, LongCostFactor: 2, PollsPerRun: 500,
			AlertTimeout: 5 * time.Second, MetricsTimeout: 2 * time.Second,
		},
		AnswerCache: AnswerCache{TTL: time.Hour},
		Retrieval: Retrieval{
			TopK:               3,
			Candidates:         10,
			CacheTTL:           time.Hour,
			KnowledgeBases:     []KnowledgeBase{{Name: "sluice-docs", Builtin: "sluice-docs"}},
			DefaultKB:          "sluice-docs",
			ChunkTokens:        120,
			ChunkOverlapTokens: 24,
		},
		Auth: Auth{AllowAnonymous: true},
		Limits: Limits{
			Enabled:     true,
			DefaultTier: "standard",
			Tiers: map[string]Tier{
				"free": {
					Weight: 2, MaxWait: 15 * time.Second, MaxQueuePerTenant: 100, MaxOutputTokens: 512,
					Tenant: Rate{TokensPerMinute: 50000, RequestsPerMinute: 100},
					User:   Rate{TokensPerMinute: 20000, RequestsPerMinute: 30},
					IP:     Rate{RequestsPerMinute: 120},
				},
				"standard": {
					Weight: 3, MaxQueuePerTenant: 1000,
					Tenant: Rate{TokensPerMinute: 200000, RequestsPerMinute: 300},
					User:   Rate{TokensPerMinute: 60000, RequestsPerMinute: 120},
					IP:     Rate{RequestsPerMinute: 600},
				},
				"vip": {
					Weight: 5, MaxWait: 60 * time.Second, MaxQueuePerTenant: 5000,
					Tenant: Rate{TokensPerMinute: 1000000, RequestsPerMinute: 1000},
				},
			},
		},
		Log: Log{Level: "info", Format: "text"},
	}
}

// TierOf returns the named tier, or the default tier for "".
func (c Config) TierOf(name string) (Tier, string) {
	if name == "" {
		name = c.Limits.DefaultTier
	}
	return c.Limits.Tiers[name], name
}

// Load reads path (if not empty) over the defaults, applies environment
// overrides from environ (KEY=VALUE pairs, as os.Environ returns) and
// validates the result.
func Load(path string, environ []string) (Config, error) {
	cfg := Default()
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("read config %s: %w", path, err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(raw)))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
			return Config{}, fmt.Errorf("parse config %s: %w", path, err)
		}
	}
	if err := applyEnv(&cfg, environ); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate checks every field and reports all problems at once, each
// naming its field by its YAML path.
func (c Config) Validate() error {
	var v validator
	v.nonEmpty("api.addr", c.API.Addr)
	v.positive("api.max_body_bytes", c.API.MaxBodyBytes)
	v.positive("api.max_query_chars", int64(c.API.MaxQueryChars))
	v.positive("api.default_max_tokens", int64(c.API.DefaultMaxTokens))
	v.positive("api.max_tokens_limit", int64(c.API.MaxTokensLimit))
	if c.API.DefaultMaxTokens > c.API.MaxTokensLimit {
		v.add("api.default_max_tokens", "must not exceed api.max_tokens_limit (%d)", c.API.MaxTokensLimit)
	}
	v.duration("api.stream_idle_timeout", c.API.StreamIdleTimeout)
	v.duration("api.shutdown_timeout", c.API.ShutdownTimeout)
	if c.API.DisconnectGrace < 0 {
		v.add("api.disconnect_grace", "must be >= 0, got %s", c.API.DisconnectGrace)
	}
	v.duration("api.queue_poll_interval", c.API.QueuePollInterval)
	v.positive("api.max_starts_in_flight", int64(c.API.MaxStartsInFlight))

	v.nonEmpty("temporal.host_port", c.Temporal.HostPort)
	v.nonEmpty("temporal.namespace", c.Temporal.Namespace)
	v.nonEmpty("temporal.task_queue", c.Temporal.TaskQueue)
	v.positive("temporal.max_concurrent_activities", int64(c.Temporal.MaxConcurrentActivities))
	v.positive("temporal.max_concurrent_workflow_tasks", int64(c.Temporal.MaxConcurrentWorkflowTasks))

	v.nonEmpty("redis.addr", c.Redis.Addr)
	if c.Redis.DB < 0 {
		v.add("redis.db", "must be >= 0, got %d", c.Redis.DB)
	}

	v.duration("events.ttl", c.Events.TTL)
	v.positive("events.max_len", c.Events.MaxLen)

	v.duration("admission.max_wait", c.Admission.MaxWait)
	v.duration("admission.lease", c.Admission.Lease)
	if c.Admission.Lease > 0 && c.Admission.Lease < 3*time.Second {
		v.add("admission.lease", "must be at least 3s (it is renewed every third of it, and a lost lease lets another request in), got %s", c.Admission.Lease)
	}
	v.duration("admission.recheck_interval", c.Admission.RecheckInterval)
	v.duration("admission.max_recheck_interval", c.Admission.MaxRecheckInterval)
	if c.Admission.FastWait < 0 || c.Admission.FastWait >= 4*time.Second {
		v.add("admission.fast_wait", "must be between 0 (off) and 4s, got %s", c.Admission.FastWait)
	}
	if c.Admission.MaxRecheckInterval > 0 && c.Admission.MaxRecheckInterval < c.Admission.RecheckInterval {
		v.add("admission.max_recheck_interval", "must be at least admission.recheck_interval (%s), got %s", c.Admission.RecheckInterval, c.Admission.MaxRecheckInterval)
	}
	if c.Admission.RecheckInterval > 0 && c.Admission.RecheckInterval < time.Second {
		v.add("admission.recheck_interval", "must be at least 1s (workflow timers are not sub-second), got %s", c.Admission.RecheckInterval)
	}
	v.positive("admission.max_queue_depth", int64(c.Admission.MaxQueueDepth))

	v.pool("pools.short", c.Pools.Short)
	v.pool("pools.long", c.Pools.Long)

	v.positive("routing.short_threshold_tokens", int64(c.Routing.ShortThresholdTokens))
	switch c.Routing.Encoding {
	case "cl100k_base", "o200k_base":
	default:
		v.add("routing.encoding", "must be cl100k_base or o200k_base, got %q", c.Routing.Encoding)
	}
	if c.Pools.Short.MaxPromptTokens > 0 && c.Routing.ShortThresholdTokens > c.Pools.Short.MaxPromptTokens {
		v.add("routing.short_threshold_tokens", "must not exceed pools.short.max_prompt_tokens (%d)", c.Pools.Short.MaxPromptTokens)
	}

	v.duration("llm.timeout", c.LLM.Timeout)
	v.duration("llm.heartbeat_timeout", c.LLM.HeartbeatTimeout)
	v.positive("llm.max_attempts", int64(c.LLM.MaxAttempts))

	v.embedding(c.Embedding)
	v.rerank(c.Rerank)

	v.positive("retrieval.top_k", int64(c.Retrieval.TopK))
	v.positive("retrieval.candidates", int64(c.Retrieval.Candidates))
	if c.Retrieval.Candidates < c.Retrieval.TopK {
		v.add("retrieval.candidates", "must be >= retrieval.top_k (%d), got %d", c.Retrieval.TopK, c.Retrieval.Candidates)
	}
	v.duration("retrieval.cache_ttl", c.Retrieval.CacheTTL)
	v.positive("retrieval.chunk_tokens", int64(c.Retrieval.ChunkTokens))
	v.positive("ingest.max_concurrent", int64(c.Ingest.MaxConcurrent))
	v.duration("ingest.max_wait", c.Ingest.MaxWait)
	if c.Ingest.Lease < 3*time.Second {
		v.add("ingest.lease", "must be at least 3s (it is renewed every third of it), got %s", c.Ingest.Lease)
	}
	v.positive("ingest.max_documents", int64(c.Ingest.MaxDocuments))
	v.positive("ingest.max_body_bytes", c.Ingest.MaxBodyBytes)
	v.duration("sessions.ttl", c.Sessions.TTL)
	v.duration("metrics.latency_slot", c.Metrics.LatencySlot)
	if c.Metrics.LatencyRetention < c.Metrics.LatencySlot {
		v.add("metrics.latency_retention", "must be at least metrics.latency_slot (%s), got %s", c.Metrics.LatencySlot, c.Metrics.LatencyRetention)
	}
	v.healing(c)
	v.positive("sessions.max_turns", int64(c.Sessions.MaxTurns))
	// A budget beyond what a pool takes is not an error: the oldest turns
	// of a prompt that does not fit are shed, after its context.
	if c.Sessions.HistoryTokens < 0 {
		v.add("sessions.history_tokens", "must not be negative, got %d", c.Sessions.HistoryTokens)
	}
	v.duration("answer_cache.ttl", c.AnswerCache.TTL)
	cached := map[string]bool{}
	for i, kb := range c.AnswerCache.KBs {
		if kb == "" || cached[kb] {
			v.add(fmt.Sprintf("answer_cache.kbs[%d]", i), "must be a knowledge base named once, got %q", kb)
		}
		cached[kb] = true
	}
	if c.Retrieval.ChunkOverlapTokens < 0 || c.Retrieval.ChunkOverlapTokens >= c.Retrieval.ChunkTokens {
		v.add("retrieval.chunk_overlap_tokens", "must be at least 0 and below retrieval.chunk_tokens, got %d", c.Retrieval.ChunkOverlapTokens)
	}
	if len(c.Retrieval.KnowledgeBases) == 0 {
		v.add("retrieval.knowledge_bases", "must name at least one knowledge base")
	}
	seen := map[string]bool{}
	for i, kb := range c.Retrieval.KnowledgeBases {
		field := fmt.Sprintf("retrieval.knowledge_bases[%d]", i)
		if kb.Name == "" {
			v.add(field+".name", "must not be empty")
		}
		if seen[kb.Name] {
			v.add(field+".name", "duplicate knowledge base %q", kb.Name)
		}
		seen[kb.Name] = true
		if (kb.Builtin == "") == (kb.Dir == "") {
			v.add(field, "set exactly one of builtin or dir")
		}
	}
	if c.Retrieval.DefaultKB != "" && !seen[c.Retrieval.DefaultKB] {
		v.add("retrieval.default_kb", "names unknown knowledge base %q", c.Retrieval.DefaultKB)
	}

	if !c.Auth.AllowAnonymous && len(c.Auth.APIKeys) == 0 {
		v.add("auth.api_keys", "must not be empty when auth.allow_anonymous is false")
	}
	keys := map[string]bool{}
	for i, k := range c.Auth.APIKeys {
		field := fmt.Sprintf("auth.api_keys[%d]", i)
		if k.Key == "" {
			v.add(field+".key", "must not be empty")
		}
		if keys[k.Key] {
			v.add(field+".key", "duplicate key")
		}
		keys[k.Key] = true
		if k.Tenant == "" {
			v.add(field+".tenant", "must not be empty")
		}
	}

	v.limits(c)

	switch strings.ToLower(c.Log.Level) {
	case "debug", "info", "warn", "error":
	default:
		v.add("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		v.add("log.format", "must be text or json, got %q", c.Log.Format)
	}
	return v.err()
}

type validator struct{ problems []string }

func (v *validator) add(field, format string, args ...any) {
	v.problems = append(v.problems, field+": "+fmt.Sprintf(format, args...))
}

func (v *validator) nonEmpty(field, s string) {
	if strings.TrimSpace(s) == "" {
		v.add(field, "must not be empty")
	}
}

func (v *validator) positive(field string, n int64) {
	if n <= 0 {
		v.add(field, "must be > 0, got %d", n)
	}
}

func (v *validator) duration(field string, d time.Duration) {
	if d <= 0 {
		v.add(field, "must be a positive duration such as 30s, got %s", d)
	}
}

func (v *validator) pool(field string, p Pool) {
	if len(p.Endpoints) == 0 {
		v.add(field+".endpoints", "must list at least one URL")
	}
	for i, e := range p.Endpoints {
		v.httpURL(fmt.Sprintf("%s.endpoints[%d]", field, i), e)
	}
	v.nonEmpty(field+".model", p.Model)
	v.positive(field+".max_concurrency", int64(p.MaxConcurrency))
	v.positive(field+".max_prompt_tokens", int64(p.MaxPromptTokens))
	if p.MaxWait < 0 {
		v.add(field+".max_wait", "must not be negative, got %s", p.MaxWait)
	}
	h := p.Healing
	if h.MinPermits < 1 || (p.MaxConcurrency > 0 && h.MinPermits > p.MaxConcurrency) {
		v.add(field+".healing.min_permits", "must be between 1 and %s.max_concurrency (%d), got %d", field, p.MaxConcurrency, h.MinPermits)
	}
	if h.BaseBatch < 0 {
		v.add(field+".healing.base_batch", "must be >= 0 (0: the batch is not tuned), got %d", h.BaseBatch)
	}
	if h.MinBatch < 1 || (h.BaseBatch > 0 && h.MinBatch > h.BaseBatch) {
		v.add(field+".healing.min_batch", "must be between 1 and %s.healing.base_batch (%d), got %d", field, h.BaseBatch, h.MinBatch)
	}
	v.scaler(field+".scaler", p.Scaler)
}

func (v *validator) scaler(field string, s Scaler) {
	switch s.Kind {
	case ScalerNone:
		return
	case ScalerSimulator:
		v.httpURL(field+".url", s.URL)
	case ScalerWebhook:
		v.httpURL(field+".url", s.URL)
		if s.StatusURL != "" {
			v.httpURL(field+".status_url", s.StatusURL)
		}
	case ScalerKubernetes:
		v.nonEmpty(field+".deployment", s.Deployment)
		if s.APIServer != "" {
			v.httpURL(field+".api_server", s.APIServer)
		}
	default:
		v.add(field+".kind", "must be none, simulator, webhook or kubernetes, got %q", s.Kind)
		return
	}
	v.positive(field+".base_replicas", int64(s.BaseReplicas))
	if s.MaxReplicas < s.BaseReplicas {
		v.add(field+".max_replicas", "must be at least %s.base_replicas (%d), got %d", field, s.BaseReplicas, s.MaxReplicas)
	}
	v.duration(field+".timeout", s.Timeout)
}

func (v *validator) healing(c Config) {
	h := c.Healing
	v.duration("healing.interval", h.Interval)
	v.duration("healing.window", h.Window)
	if h.Window > c.Metrics.LatencyRetention {
		v.add("healing.window", "must not exceed metrics.latency_retention (%s), got %s", c.Metrics.LatencyRetention, h.Window)
	}
	if !slices.Contains(HealingStages(), h.Stage) {
		v.add("healing.stage", "must be one of %s, got %q", strings.Join(HealingStages(), ", "), h.Stage)
	}
	if !(h.WarnRatio > 1) {
		v.add("healing.warn_ratio", "must be > 1 (P99 is never below P50), got %v", h.WarnRatio)
	}
	if !(h.CriticalRatio >= h.WarnRatio) {
		v.add("healing.critical_ratio", "must be at least healing.warn_ratio (%v), got %v", h.WarnRatio, h.CriticalRatio)
	}
	if !(h.WarnKVCache > 0 && h.WarnKVCache <= 1) {
		v.add("healing.warn_kv_cache", "must be in (0, 1], got %v", h.WarnKVCache)
	}
	v.positive("healing.critical_queue_depth", int64(h.CriticalQueueDepth))
	if h.CriticalP99 < 0 {
		v.add("healing.critical_p99", "must not be negative, got %s", h.CriticalP99)
	}
	if !(h.CriticalTimeoutRate > 0 && h.CriticalTimeoutRate <= 1) {
		v.add("healing.critical_timeout_rate", "must be in (0, 1], got %v", h.CriticalTimeoutRate)
	}
	v.positive("healing.min_samples", h.MinSamples)
	v.positive("healing.healthy_polls", int64(h.HealthyPolls))
	// A step back must rest on a whole window of healthy latencies, or the
	// healer undoes an action while the window still shows its effect
	// rather than the load (bench-heal saw the tail return 12 s after a
	// step back taken too early).
	if h.HealthyPolls > 0 && time.Duration(h.HealthyPolls)*h.Interval < h.Window {
		v.add("healing.healthy_polls", "healthy_polls × interval (%s) must be at least healing.window (%s)",
			time.Duration(h.HealthyPolls)*h.Interval, h.Window)
	}
	// The window must hold only latencies from after an action before the
	// next decision, or the healer escalates again on the tail it already
	// answered.
	if h.Cooldown < h.Window {
		v.add("healing.cooldown", "must be at least healing.window (%s), got %s", h.Window, h.Cooldown)
	}
	if !(h.LongCostFactor >= 1 && h.LongCostFactor <= MaxLongCostFactor) {
		v.add("healing.long_cost_factor", "must be between 1 and %d, got %v", MaxLongCostFactor, h.LongCostFactor)
	}
	v.positive("healing.polls_per_run", int64(h.PollsPerRun))
	if h.AlertWebhook != "" {
		v.httpURL("healing.alert_webhook", h.AlertWebhook)
	}
	v.duration("healing.alert_timeout", h.AlertTimeout)
	v.duration("healing.metrics_timeout", h.MetricsTimeout)
}

func (v *validator) httpURL(field, s string) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.add(field, "must be an http(s) URL, got %q", s)
	}
}

func (v *validator) embedding(e Embedding) {
	switch e.Provider {
	case EmbeddingLocal:
		// Local's vectors are defined by its code, not by a name, so any
		// other name would be a promise the embedder cannot keep.
		if e.Model != "local-hash-v1" {
			v.add("embedding.model", "must be local-hash-v1 with embedding.provider local, got %q", e.Model)
		}
		if e.Endpoint != "" {
			v.add("embedding.endpoint", "is for embedding.provider openai; the local embedder needs none, got %q", e.Endpoint)
		}
	case EmbeddingOpenAI:
		v.nonEmpty("embedding.model", e.Model)
		v.httpURL("embedding.endpoint", e.Endpoint)
	default:
		v.add("embedding.provider", "must be local or openai, got %q", e.Provider)
	}
	if e.Dims < 0 {
		v.add("embedding.dims", "must be >= 0 (0: the embedder's own length), got %d", e.Dims)
	}
	v.duration("embedding.timeout", e.Timeout)
	v.duration("embedding.cache_ttl", e.CacheTTL)
	v.positive("embedding.lru_size", int64(e.LRUSize))
}

func (v *validator) rerank(r Rerank) {
	switch r.Provider {
	case RerankLexical:
		if r.Endpoint != "" {
			v.add("rerank.endpoint", "is for rerank.provider http; the lexical reranker needs none, got %q", r.Endpoint)
		}
	case RerankHTTP:
		v.httpURL("rerank.endpoint", r.Endpoint)
		if strings.TrimSpace(r.Model) == "" {
			v.add("rerank.model", "must name the model the server runs (it versions reranked results)")
		}
	default:
		v.add("rerank.provider", "must be lexical or http, got %q", r.Provider)
	}
	v.duration("rerank.timeout", r.Timeout)
	v.positive("rerank.max_batch", int64(r.MaxBatch))
}

func (v *validator) limits(c Config) {
	if len(c.Limits.Tiers) == 0 {
		v.add("limits.tiers", "must define at least one tier")
	}
	if _, ok := c.Limits.Tiers[c.Limits.DefaultTier]; !ok {
		v.add("limits.default_tier", "names unknown tier %q", c.Limits.DefaultTier)
	}
	for i, k := range c.Auth.APIKeys {
		if _, ok := c.Limits.Tiers[k.Tier]; k.Tier != "" && !ok {
			v.add(fmt.Sprintf("auth.api_keys[%d].tier", i), "names unknown tier %q", k.Tier)
		}
	}
	names := make([]string, 0, len(c.Limits.Tiers))
	for name := range c.Limits.Tiers {
		names = append(names, name)
	}
	sort.Strings(names) // report problems in a stable order
	for _, name := range names {
		t := c.Limits.Tiers[name]
		field := "limits.tiers." + name
		v.positive(field+".weight", int64(t.Weight))
		if t.MaxWait < 0 {
			v.add(field+".max_wait", "must be >= 0, got %s", t.MaxWait)
		}
		if t.MaxQueuePerTenant < 0 {
			v.add(field+".max_queue_per_tenant", "must be >= 0, got %d", t.MaxQueuePerTenant)
		}
		if t.MaxOutputTokens < 0 || t.MaxOutputTokens > c.API.MaxTokensLimit {
			v.add(field+".max_output_tokens", "must be between 0 and api.max_tokens_limit (%d), got %d", c.API.MaxTokensLimit, t.MaxOutputTokens)
		}
		for _, d := range []struct {
			dim string
			r   Rate
		}{{"tenant", t.Tenant}, {"user", t.User}, {"ip", t.IP}} {
			f, r := field+"."+d.dim, d.r
			if r.TokensPerMinute < 0 || r.TokenBurst < 0 || r.RequestsPerMinute < 0 || r.RequestBurst < 0 {
				v.add(f, "rates and bursts must be >= 0")
			}
			if r.TokensPerMinute == 0 && r.TokenBurst > 0 {
				v.add(f+".token_burst", "needs tokens_per_minute")
			}
			if r.RequestsPerMinute == 0 && r.RequestBurst > 0 {
				v.add(f+".request_burst", "needs requests_per_minute")
			}
		}
	}
}

func (v *validator) err() error {
	if len(v.problems) == 0 {
		return nil
	}
	return fmt.Errorf("invalid config:\n  %s", strings.Join(v.problems, "\n  "))
}

// FromCommandLine loads the configuration of a Sluice command: the file
// named by -config (default $SLUICE_CONFIG, none for the defaults) with the
// process's SLUICE_* environment on top.
func FromCommandLine(name string, args []string) (Config, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	path := fs.String("config", os.Getenv("SLUICE_CONFIG"), "YAML config file (env SLUICE_CONFIG); SLUICE_* variables override it")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%s: unexpected arguments %v", name, fs.Args())
	}
	return Load(*path, os.Environ())
}
