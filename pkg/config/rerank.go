package config

import (
	"strings"
	"time"
)

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

func defaultRerank() Rerank {
	return Rerank{
		Provider: RerankLexical,
		Timeout:  5 * time.Second,
		MaxBatch: 32,
	}
}

func (r Rerank) validate(v *validator) {
	switch r.Provider {
	case RerankLexical:
		v.unusedEndpoint("rerank", RerankHTTP, "lexical reranker", r.Endpoint)
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
