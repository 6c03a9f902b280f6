package config

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/pkg/kbref"
)

// Retrieval configures knowledge-base search.
type Retrieval struct {
	// TopK chunks go into the prompt after rerank.
	TopK int `yaml:"top_k"`
	// Candidates are fetched by retrieval and cut to TopK by rerank.
	Candidates int `yaml:"candidates"`
	// CacheTTL is the Redis TTL of a cached retrieval result.
	CacheTTL time.Duration `yaml:"cache_ttl"`
	// KnowledgeBases are the kbs seeded from a source at start (and again
	// whenever Redis lost them): each shared, or one tenant's own. Tenants
	// also make kbs of their own through the API.
	KnowledgeBases []KnowledgeBase `yaml:"knowledge_bases"`
	// DefaultKB is used when a request names none; a shared kb.
	DefaultKB string `yaml:"default_kb"`
	// ChunkTokens bounds one chunk; used to estimate prompt size before
	// retrieval has run.
	ChunkTokens int `yaml:"chunk_tokens"`
	// ChunkOverlapTokens is how much of a chunk's end the next one repeats
	// when a break falls inside a paragraph (0: none).
	ChunkOverlapTokens int `yaml:"chunk_overlap_tokens"`
	// KBMemoryBytes is what each worker process holds for the kbs it
	// searches, together (their text, vectors and index): the least
	// recently used are dropped to make room. It is also the most one kb
	// may need: ingestion refuses a batch that would take a kb past it.
	// Size a worker's memory for it plus about 256 MiB.
	KBMemoryBytes int64 `yaml:"kb_memory_bytes"`
}

// KnowledgeBase names a corpus. Dir, if set, loads *.md and *.txt files
// from a directory; otherwise Builtin names a corpus compiled into Sluice.
// Exactly one of Shared and Tenant says whose it is.
type KnowledgeBase struct {
	Name string `yaml:"name"`
	// Shared makes the kb readable by every tenant and writable by none
	// through the API: its source here is its content. Its name is then
	// taken from every tenant (a tenant's kb of that name is unreachable).
	Shared bool `yaml:"shared"`
	// Tenant makes the kb that tenant's own, as if it had ingested it.
	Tenant  string `yaml:"tenant"`
	Builtin string `yaml:"builtin"`
	Dir     string `yaml:"dir"`
}

// key is the kb's key in storage (kbref's): a kb marked shared is known
// by its name alone.
func (k KnowledgeBase) key() string {
	if k.Shared {
		return kbref.Shared(k.Name).Key()
	}
	return kbref.Own(k.Tenant, k.Name).Key()
}

// Ingest bounds document ingestion (POST /v1/kb/:kb/documents), which
// chunks and embeds and so is expensive too: it holds one of
// MaxConcurrent leased permits shared by every API instance.
type Ingest struct {
	MaxConcurrent int `yaml:"max_concurrent"`
	// MaxConcurrentPerTenant is the most permits one tenant holds, so
	// that one tenant's uploads never take them all; 0 is half of
	// MaxConcurrent, rounded up (TenantPermits). With others waiting a
	// tenant's share is less: MaxConcurrent divided among the tenants
	// holding or waiting for a permit.
	MaxConcurrentPerTenant int `yaml:"max_concurrent_per_tenant"`
	// MaxConcurrentPerProcess is the most batches one API process ingests
	// at once, whatever permits are free: the permits bound ingestion
	// across the deployment, this bounds one process's memory, since a
	// batch holds about ten times its body while it is chunked, embedded
	// and stored (a 16 MiB batch ~160 MiB; docs/security.md).
	MaxConcurrentPerProcess int `yaml:"max_concurrent_per_process"`
	// MaxWait is how long a request waits for a permit before 503.
	MaxWait time.Duration `yaml:"max_wait"`
	// Lease is a permit's lease, renewed while the ingestion runs.
	Lease time.Duration `yaml:"lease"`
	// MaxDocuments bounds one request's batch; MaxBodyBytes its body.
	MaxDocuments int   `yaml:"max_documents"`
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxMetadataBytes bounds one document's metadata (keys and values
	// together), which is stored and counted in its tenant's quota.
	MaxMetadataBytes int `yaml:"max_metadata_bytes"`
}

// AnswerCache configures the L3 tier, which serves a repeated question
// its earlier answer without an LLM call. An answer is only right for the
// same kb version, model and prompt, all of which are in its key; still,
// it is off unless a kb is listed, because a kb's owner must agree that
// one answer fits every asker.
type AnswerCache struct {
	// KBs lists the knowledge bases whose answers are cached: the name of
	// a shared kb (its answers are served to every tenant), or
	// "<tenant>/<name>" for a tenant's own (served within that tenant).
	KBs []string `yaml:"kbs"`
	// TTL is how long an answer is kept.
	TTL time.Duration `yaml:"ttl"`
}

func defaultRetrieval() Retrieval {
	return Retrieval{
		TopK:               3,
		Candidates:         10,
		CacheTTL:           time.Hour,
		KnowledgeBases:     []KnowledgeBase{{Name: "sluice-docs", Shared: true, Builtin: "sluice-docs"}},
		DefaultKB:          "sluice-docs",
		ChunkTokens:        120,
		ChunkOverlapTokens: 24,
		KBMemoryBytes:      512 << 20,
	}
}

// TenantPermits is the most ingestion permits one tenant holds.
func (i Ingest) TenantPermits() int {
	if i.MaxConcurrentPerTenant > 0 {
		return i.MaxConcurrentPerTenant
	}
	return (i.MaxConcurrent + 1) / 2
}

func defaultIngest() Ingest {
	return Ingest{MaxConcurrent: 10, MaxConcurrentPerProcess: 2, MaxWait: 30 * time.Second, Lease: 30 * time.Second,
		MaxDocuments: 100, MaxBodyBytes: 16 << 20, MaxMetadataBytes: 8 << 10}
}

func defaultAnswerCache() AnswerCache {
	return AnswerCache{TTL: time.Hour}
}

func (r Retrieval) validate(v *validator) {
	v.positive("retrieval.top_k", int64(r.TopK))
	v.positive("retrieval.candidates", int64(r.Candidates))
	if r.Candidates < r.TopK {
		v.add("retrieval.candidates", "must be >= retrieval.top_k (%d), got %d", r.TopK, r.Candidates)
	}
	v.duration("retrieval.cache_ttl", r.CacheTTL)
	v.positive("retrieval.chunk_tokens", int64(r.ChunkTokens))
	if r.ChunkOverlapTokens < 0 || r.ChunkOverlapTokens >= r.ChunkTokens {
		v.add("retrieval.chunk_overlap_tokens", "must be at least 0 and below retrieval.chunk_tokens, got %d", r.ChunkOverlapTokens)
	}
	if r.KBMemoryBytes < minKBMemoryBytes {
		v.add("retrieval.kb_memory_bytes", "must be at least %d (1 MiB), got %d", minKBMemoryBytes, r.KBMemoryBytes)
	}
	r.validateKnowledgeBases(v)
}

// minKBMemoryBytes is the least retrieval.kb_memory_bytes: below it a
// worker could hold hardly any kb.
const minKBMemoryBytes = 1 << 20

// validateKnowledgeBases checks that the kbs are named once each, each
// from one source and with one owner, and that the default is one of them
// and shared.
func (r Retrieval) validateKnowledgeBases(v *validator) {
	if len(r.KnowledgeBases) == 0 {
		v.add("retrieval.knowledge_bases", "must name at least one knowledge base")
	}
	seen := map[string]bool{}
	for i, kb := range r.KnowledgeBases {
		field := fmt.Sprintf("retrieval.knowledge_bases[%d]", i)
		// Names are unique per owner: two tenants may each configure a
		// "docs" (a tenant may not take a shared kb's name: below).
		v.uniqueName(seen, field+".name", kb.key(), fmt.Sprintf("duplicate knowledge base %q", kb.Name))
		if kb.Name != "" && !kbref.ValidName(kb.Name) {
			v.add(field+".name", "must be %s, got %q", kbref.NameRule, kb.Name)
		}
		if kb.Shared == (kb.Tenant != "") {
			v.add(field, "set exactly one of shared: true or tenant")
		}
		if (kb.Builtin == "") == (kb.Dir == "") {
			v.add(field, "set exactly one of builtin or dir")
		}
	}
	shared := r.sharedKBs()
	for i, kb := range r.KnowledgeBases {
		if !kb.Shared && kb.Tenant != "" && shared[kb.Name] {
			v.add(fmt.Sprintf("retrieval.knowledge_bases[%d].name", i), "%q is a shared knowledge base's name", kb.Name)
		}
	}
	isNamed := func(kb KnowledgeBase) bool { return kb.Name == r.DefaultKB }
	switch {
	case r.DefaultKB == "" || shared[r.DefaultKB]:
	case slices.ContainsFunc(r.KnowledgeBases, isNamed):
		// The default is every tenant's when they name none.
		v.add("retrieval.default_kb", "names %q, which is not shared", r.DefaultKB)
	default:
		v.add("retrieval.default_kb", "names unknown knowledge base %q", r.DefaultKB)
	}
}

// sharedKBs are the names of the configured shared kbs.
func (r Retrieval) sharedKBs() map[string]bool {
	out := map[string]bool{}
	for _, kb := range r.KnowledgeBases {
		if kb.Shared {
			out[kb.Name] = true
		}
	}
	return out
}

func (i Ingest) validate(v *validator) {
	v.positive("ingest.max_concurrent", int64(i.MaxConcurrent))
	if i.MaxConcurrentPerTenant < 0 || i.MaxConcurrentPerTenant > i.MaxConcurrent {
		v.add("ingest.max_concurrent_per_tenant", "must be from 0 (half of ingest.max_concurrent) to ingest.max_concurrent (%d), got %d",
			i.MaxConcurrent, i.MaxConcurrentPerTenant)
	}
	v.positive("ingest.max_concurrent_per_process", int64(i.MaxConcurrentPerProcess))
	v.duration("ingest.max_wait", i.MaxWait)
	if i.Lease < 3*time.Second {
		v.add("ingest.lease", "must be at least 3s (it is renewed every third of it), got %s", i.Lease)
	}
	v.positive("ingest.max_documents", int64(i.MaxDocuments))
	v.positive("ingest.max_body_bytes", i.MaxBodyBytes)
	v.positive("ingest.max_metadata_bytes", int64(i.MaxMetadataBytes))
	if int64(i.MaxMetadataBytes) > i.MaxBodyBytes {
		v.add("ingest.max_metadata_bytes", "must be at most ingest.max_body_bytes (%d), got %d", i.MaxBodyBytes, i.MaxMetadataBytes)
	}
}

// validate checks the listed kbs against the configured shared ones: a
// bare name must be one, since an answer from it is served to every
// tenant; a tenant's own kb is named with its tenant, whose alone its
// answers stay.
func (a AnswerCache) validate(v *validator, r Retrieval) {
	v.duration("answer_cache.ttl", a.TTL)
	shared := r.sharedKBs()
	cached := map[string]bool{}
	for i, kb := range a.KBs {
		field := fmt.Sprintf("answer_cache.kbs[%d]", i)
		if kb == "" || cached[kb] {
			v.add(field, "must be a knowledge base named once, got %q", kb)
		}
		cached[kb] = true
		ref, err := kbref.ParseKey(kb)
		switch {
		case kb == "":
		case err != nil:
			v.add(field, "must be a shared knowledge base's name or <tenant>/<name>, got %q", kb)
		case ref.IsShared() && !shared[kb]:
			v.add(field, "names %q, which is not a shared knowledge base of retrieval.knowledge_bases; name a tenant's own as <tenant>/%s", kb, kb)
		}
	}
}
