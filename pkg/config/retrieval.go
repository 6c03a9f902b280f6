package config

import (
	"fmt"
	"time"
)

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

// KnowledgeBase names a corpus. Dir, if set, loads *.md and *.txt files
// from a directory; otherwise Builtin names a corpus compiled into Sluice.
type KnowledgeBase struct {
	Name    string `yaml:"name"`
	Builtin string `yaml:"builtin"`
	Dir     string `yaml:"dir"`
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

func defaultRetrieval() Retrieval {
	return Retrieval{
		TopK:               3,
		Candidates:         10,
		CacheTTL:           time.Hour,
		KnowledgeBases:     []KnowledgeBase{{Name: "sluice-docs", Builtin: "sluice-docs"}},
		DefaultKB:          "sluice-docs",
		ChunkTokens:        120,
		ChunkOverlapTokens: 24,
	}
}

func defaultIngest() Ingest {
	return Ingest{MaxConcurrent: 10, MaxWait: 30 * time.Second, Lease: 30 * time.Second, MaxDocuments: 100, MaxBodyBytes: 16 << 20}
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
	r.validateKnowledgeBases(v)
}

// validateKnowledgeBases checks that the kbs are named once each, each
// from one source, and that the default is one of them.
func (r Retrieval) validateKnowledgeBases(v *validator) {
	if len(r.KnowledgeBases) == 0 {
		v.add("retrieval.knowledge_bases", "must name at least one knowledge base")
	}
	seen := map[string]bool{}
	for i, kb := range r.KnowledgeBases {
		field := fmt.Sprintf("retrieval.knowledge_bases[%d]", i)
		v.uniqueName(seen, field+".name", kb.Name, fmt.Sprintf("duplicate knowledge base %q", kb.Name))
		if (kb.Builtin == "") == (kb.Dir == "") {
			v.add(field, "set exactly one of builtin or dir")
		}
	}
	if r.DefaultKB != "" && !seen[r.DefaultKB] {
		v.add("retrieval.default_kb", "names unknown knowledge base %q", r.DefaultKB)
	}
}

func (i Ingest) validate(v *validator) {
	v.positive("ingest.max_concurrent", int64(i.MaxConcurrent))
	v.duration("ingest.max_wait", i.MaxWait)
	if i.Lease < 3*time.Second {
		v.add("ingest.lease", "must be at least 3s (it is renewed every third of it), got %s", i.Lease)
	}
	v.positive("ingest.max_documents", int64(i.MaxDocuments))
	v.positive("ingest.max_body_bytes", i.MaxBodyBytes)
}

func (a AnswerCache) validate(v *validator) {
	v.duration("answer_cache.ttl", a.TTL)
	cached := map[string]bool{}
	for i, kb := range a.KBs {
		if kb == "" || cached[kb] {
			v.add(fmt.Sprintf("answer_cache.kbs[%d]", i), "must be a knowledge base named once, got %q", kb)
		}
		cached[kb] = true
	}
}
