package config

import "time"

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

func defaultEmbedding() Embedding {
	return Embedding{
		Provider: EmbeddingLocal,
		Model:    "local-hash-v1",
		Timeout:  10 * time.Second,
		CacheTTL: 24 * time.Hour,
		LRUSize:  10000,
	}
}

func (e Embedding) validate(v *validator) {
	switch e.Provider {
	case EmbeddingLocal:
		// Local's vectors are defined by its code, not by a name, so any
		// other name would be a promise the embedder cannot keep.
		if e.Model != "local-hash-v1" {
			v.add("embedding.model", "must be local-hash-v1 with embedding.provider local, got %q", e.Model)
		}
		v.unusedEndpoint("embedding", EmbeddingOpenAI, "local embedder", e.Endpoint)
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
